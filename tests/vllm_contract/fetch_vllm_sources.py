"""Fetch the Python sources of the vLLM releases the contract tests check (`make install-test`).

    python tests/vllm_contract/fetch_vllm_sources.py [--out DIR] [VERSION ...]

For each version: the sdist from PyPI's simple index (PEP 691 JSON), its sha256 checked against the
index, kept as DIR/vllm-VERSION.tar.gz (not downloaded again), and its ``vllm/`` Python files unpacked
into DIR/VERSION/vllm/ (plus PKG-INFO), with DIR/VERSION/FETCHED.json recording the file, its bytes
and the seconds taken. Exit status 1 (one line on stderr) on any failure, so make can fail on it.

Why the sdist and not the wheel (`pip download vllm==X --no-deps`): the x86_64 wheels are 336 MB
(0.33.0) and 239 MB (0.34.0), almost all CUDA binaries, against 47 MB and 51 MB for the sdists; the
0.34.0 sdist's 3,365 ``vllm/**/*.py`` files are byte-identical to the wheel's (checked once, sha256
of each file); the wheel adds only vendored third-party packages (vllm/third_party/deep_gemm, ...)
that nothing we check imports. And not ``pip download --no-binary :all:``: pip then prepares the
sdist's metadata, which installs vLLM's build requirements (cmake, torch==2.14.0, ...) and fails.
Standard library only: it runs before any test dependency is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_versions import CHECKED, SOURCES_DIR  # noqa: E402  (run as a script, before pytest exists)

INDEX = os.environ.get("VLLM_SOURCES_INDEX", "https://pypi.org/simple")
TIMEOUT_S = 120


def sdist_entry(version: str) -> dict:
    """The index's entry for vllm-VERSION.tar.gz: url, hashes, size."""
    req = urllib.request.Request(f"{INDEX.rstrip('/')}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        files = json.load(resp)["files"]
    name = f"vllm-{version}.tar.gz"
    for f in files:
        if f["filename"] == name:
            return f
    raise LookupError(f"{name} is not on {INDEX}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(entry: dict, dest: Path) -> None:
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(entry["url"], timeout=TIMEOUT_S) as resp, tmp.open("wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    got, want = sha256(tmp), entry["hashes"]["sha256"]
    if got != want:
        tmp.unlink()
        raise ValueError(f"{dest.name}: sha256 {got} differs from the index's {want}")
    tmp.replace(dest)


def unpack(archive: Path, version: str, root: Path) -> int:
    """vllm/**/*.py and PKG-INFO of the sdist into root; returns the number of files."""
    prefix = f"vllm-{version}/"
    tmp = root.with_name(root.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    n = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            rel = member.name[len(prefix):] if member.name.startswith(prefix) else ""
            if member.isfile() and (rel == "PKG-INFO" or (rel.startswith("vllm/") and rel.endswith(".py"))):
                member.name = rel
                tar.extract(member, tmp, filter="data")
                n += 1
    shutil.rmtree(root, ignore_errors=True)
    tmp.replace(root)
    return n


def fetch(version: str, out: Path) -> dict:
    root = out / version
    marker = root / "FETCHED.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    t0 = time.monotonic()
    entry = sdist_entry(version)
    archive = out / entry["filename"]
    if not archive.is_file() or sha256(archive) != entry["hashes"]["sha256"]:
        download(entry, archive)
    t1 = time.monotonic()
    files = unpack(archive, version, root)
    info = {"version": version, "file": entry["filename"], "bytes": archive.stat().st_size, "files": files,
            "download_s": round(t1 - t0, 2), "unpack_s": round(time.monotonic() - t1, 2)}
    marker.write_text(json.dumps(info))
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(CHECKED))
    parser.add_argument("--out", type=Path, default=SOURCES_DIR)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for version in args.versions:
        try:
            info = fetch(version, args.out)
        except Exception as exc:  # noqa: BLE001 -- one line, non-zero exit
            print(f"error: fetching the vLLM {version} sources failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        print(f"vLLM {version} sources: {info['file']}, {info['bytes']:,} bytes, {info['files']} files "
              f"(download {info['download_s']} s, unpack {info['unpack_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
