"""Run one container of a manifest the way its pod's security context runs it, and report what it did.

Started as root inside fresh mount and network namespaces (`unshare --mount --net --fork`):

    python pod_sandbox.py SPEC_JSON      # {"argv": [...], "env": {...}, "volumes": {path: medium},
                                         #  "uid": N, "gid": N, "health": "http://...", "port": N,
                                         #  "token_file": path, "settle_s": S,
                                         #  "read_only_checks": [dir, ...]}

In this namespace only: loopback comes up (the pod's network namespace, nothing else reachable);
every existing mount is remounted read-only (readOnlyRootFilesystem), except /proc, /sys and /dev;
each of the container's volumes becomes a fresh tmpfs of mode 2777 owned by group gid (an emptyDir
with the pod's fsGroup: /dev/shm included). The process runs as uid:gid with no capabilities
and no_new_privs (runAsUser, capabilities drop ALL, allowPrivilegeEscalation false). /root, where
this machine's Python lives and which only root may enter, is remounted so that the uid can read
the interpreter (a container image would have it readable). A volume path that does not exist
(/var/lib/infersight) gets its parent replaced by an empty tmpfs first, since the host is not changed.

Prints one JSON object: health and metrics status, capture status without and with the token, the
token file's owner and mode, the files the process wrote in its volumes, whether it was still
running after settle_s, and its log's last lines.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def mounts() -> list[str]:
    out = subprocess.run(["findmnt", "-rno", "TARGET"], check=True, capture_output=True, text=True).stdout
    return sorted(set(out.split()), key=len)


def prepare(spec: dict) -> None:
    sh("ip", "link", "set", "lo", "up")
    sh("mount", "--make-rprivate", "/")
    # /root is 0700: carry its .pyenv across into a tmpfs /root that the uid may enter.
    if sys.executable.startswith("/root/") or os.path.realpath(sys.executable).startswith("/root/"):
        sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/mnt")
        os.mkdir("/mnt/pyenv")
        sh("mount", "--bind", "/root/.pyenv", "/mnt/pyenv")
        sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/root")
        os.mkdir("/root/.pyenv")
        sh("mount", "--move", "/mnt/pyenv", "/root/.pyenv")
    for path in spec["volumes"]:
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            existing = parent
            while not os.path.isdir(existing):
                existing = os.path.dirname(existing)
            sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", existing)
        os.makedirs(path, exist_ok=True)
    for target in mounts():
        if not target.startswith(("/proc", "/sys", "/dev")):
            subprocess.run(["mount", "-o", "remount,bind,ro", target], capture_output=True)
    for path in spec["volumes"]:
        sh("mount", "-t", "tmpfs", "-o", f"mode=2777,gid={spec['gid']},size=64m", "tmpfs", path)


def read_only(paths: list[str]) -> dict[str, bool]:
    """Whether each directory refuses a new file even to root (EROFS): the remount took."""
    out = {}
    for path in paths:
        probe = os.path.join(path, f".ro-probe-{os.getpid()}")
        try:
            os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))
            os.unlink(probe)
            out[path] = False
        except OSError as exc:
            out[path] = exc.errno == errno.EROFS
    return out


def http(method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None) -> int:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:  # noqa: S310 (loopback of this namespace)
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def main() -> None:
    spec = json.loads(sys.argv[1])
    prepare(spec)
    log_path = "/dev/shm/.sandbox.log"  # a volume: the only place the report may write too
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["setpriv", f"--reuid={spec['uid']}", f"--regid={spec['gid']}", "--clear-groups",
                                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "env", "-i",
                                 *[f"{k}={v}" for k, v in spec["env"].items()], *spec["argv"]],
                                stdout=log, stderr=subprocess.STDOUT)
    report: dict = {"health": None, "read_only": read_only(spec["read_only_checks"])}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            report["health"] = http("GET", spec["health"])
            break
        except OSError:
            time.sleep(0.2)
    if report["health"] == 200:
        base = spec["health"].rsplit("/", 1)[0]
        report["metrics"] = http("GET", f"{base}/metrics")
        capture = json.dumps({"steps": 2}).encode()
        report["capture_without_token"] = http("POST", f"{base}/api/v1/capture", {"Content-Type": "application/json"},
                                               capture)
        st = os.lstat(spec["token_file"])
        report["token_file"] = {"uid": st.st_uid, "mode": oct(stat.S_IMODE(st.st_mode)),
                                "dir_mode": oct(stat.S_IMODE(os.lstat(os.path.dirname(spec["token_file"])).st_mode))}
        with open(spec["token_file"]) as f:
            token = f.read().strip()
        report["capture_with_token"] = http("POST", f"{base}/api/v1/capture",
                                            {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
                                            capture)
        time.sleep(spec["settle_s"])
    report["running"] = proc.poll() is None
    proc.terminate()
    try:
        report["exit"] = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        report["exit"] = proc.wait()
    report["written"] = sorted(os.path.relpath(os.path.join(d, f), "/") for v in spec["volumes"]
                               for d, _, files in os.walk(v) for f in files if os.path.join(d, f) != log_path)
    with open(log_path, errors="replace") as f:
        report["log"] = f.read()[-6000:]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
