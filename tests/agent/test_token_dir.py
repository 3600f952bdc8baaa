"""The control plane cannot be planted: the token lives in a 0700 directory of this user, file 0600,
both checked (owner, mode, no symlink) before anything in them is trusted; captures are written
0600 in 0700 directories; the agent logs where its token is. Modes are read back with os.stat,
owners set with os.chown (the owner cases need root and are skipped otherwise)."""
from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from infersight.agent.api.token_file import (
    TokenFileError, default_token_dir, default_token_file, load_or_create_token, read_token,
)
from infersight.probes.capture import StepCapture
from infersight.probes.config import default_capture_dir
from infersight.probes.control import CaptureState, CaptureTool, ControlBlock

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME, no XDG directories: the per-user fallback."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    return tmp_path


def test_default_place_is_per_user_never_a_shared_tmp_path(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_token_dir() == env / "home" / ".local" / "state" / "infersight"
    assert default_token_file(9464) == default_token_dir() / "agent-9464.token"
    runtime = env / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert default_token_dir() == runtime / "infersight"
    runtime.chmod(0o755)  # not a private runtime dir (the XDG spec requires 0700): not used
    assert default_token_dir() == env / "home" / ".local" / "state" / "infersight"
    assert default_capture_dir() == str(env / "home" / ".local" / "state" / "infersight" / "captures")


def test_created_0700_and_0600_and_read_back(env: Path) -> None:
    path = default_token_file(1234)
    token = load_or_create_token(path)
    assert mode(path.parent) == 0o700 and mode(path) == 0o600
    assert path.read_text() == token + "\n" and len(token) >= 40
    assert load_or_create_token(path) == token == read_token(path)


def test_open_directory_is_refused(env: Path) -> None:
    path = default_token_file(1234)
    path.parent.mkdir(parents=True, mode=0o755)
    path.parent.chmod(0o755)
    with pytest.raises(TokenFileError, match=r"refusing the token directory .*: mode 0755: .*chmod 700") as exc:
        load_or_create_token(path)
    assert "\n" not in str(exc.value) and not path.exists()


def test_readable_file_is_refused(env: Path) -> None:
    path = default_token_file(1234)
    load_or_create_token(path)
    path.chmod(0o644)
    with pytest.raises(TokenFileError, match="refusing the token file .*: mode 0644"):
        load_or_create_token(path)


def test_symlinked_file_is_refused(env: Path) -> None:
    path = default_token_file(1234)
    load_or_create_token(path)
    planted = env / "planted"
    planted.write_text("attacker\n")
    planted.chmod(0o600)
    path.unlink()
    path.symlink_to(planted)
    with pytest.raises(TokenFileError, match="refusing the token file .*: a symbolic link"):
        load_or_create_token(path)


@needs_root
def test_planted_as_in_the_issue_is_refused(env: Path) -> None:
    """A 0644 file owned by nobody in a 0777 directory (the issue's case), then each part alone."""
    path = default_token_file(1234)
    path.parent.mkdir(parents=True)
    path.parent.chmod(0o777)
    os.chown(path.parent, NOBODY, NOBODY)
    path.write_text("planted\n")
    path.chmod(0o644)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(TokenFileError, match="owned by uid 65534"):
        load_or_create_token(path)
    os.chown(path.parent, 0, 0)
    with pytest.raises(TokenFileError, match="mode 0777"):
        load_or_create_token(path)
    path.parent.chmod(0o700)
    path.chmod(0o600)
    with pytest.raises(TokenFileError, match="refusing the token file .*owned by uid 65534"):
        load_or_create_token(path)
    with pytest.raises(TokenFileError, match="owned by uid 65534"):
        read_token(path)  # `infersight capture` checks it too


def test_a_named_token_file_needs_a_directory_nobody_else_writes(env: Path) -> None:
    shared = env / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    token = load_or_create_token(shared / "token", private_dir=False)  # listable is fine, file is 0600
    assert mode(shared / "token") == 0o600 and read_token(shared / "token") == token
    shared.chmod(0o777)
    with pytest.raises(TokenFileError, match="mode 0777: others can write to it"):
        load_or_create_token(shared / "token", private_dir=False)


def _agent(env: Path, *args: str) -> subprocess.CompletedProcess[str]:
    child_env = {**os.environ, "HOME": str(env / "home"), "PYTHONPATH": str(REPO)}
    child_env.pop("XDG_RUNTIME_DIR", None)
    child_env.pop("XDG_STATE_HOME", None)
    return subprocess.run([sys.executable, "-m", "infersight", *args], cwd=REPO, env=child_env,
                          capture_output=True, text=True, timeout=120)


def test_agent_logs_its_token_path_and_refuses_a_planted_directory(env: Path) -> None:
    from testkit import free_port

    port = free_port()
    res = _agent(env, "agent", "--ring", "infersight-test-token-unused", "--listen", f"127.0.0.1:{port}",
                 "--duration", "0.5", "--gpu-source", "none")
    assert res.returncode == 0, res.stderr
    path = env / "home" / ".local" / "state" / "infersight" / f"agent-{port}.token"
    assert f"capture token (bearer for POST /api/v1/capture): {path}" in res.stderr
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    path.parent.chmod(0o755)
    res = _agent(env, "agent", "--ring", "infersight-test-token-unused", "--listen", f"127.0.0.1:{port}",
                 "--duration", "0.5", "--gpu-source", "none")
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert errors[0].startswith("infersight: error: refusing the token directory") and "mode 0755" in errors[0]
    assert res.stderr.strip().splitlines()[-1] == errors[0]
    path.parent.chmod(0o700)
    path.chmod(0o644)
    res = _agent(env, "capture", "--steps", "2", "--agent", f"127.0.0.1:{port}")  # the client checks it too
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "refusing the token file" in lines[0] and "0644" in lines[0]


@pytest.mark.parametrize(("tool", "suffix"), [(CaptureTool.TORCH, ".json.gz"), (CaptureTool.TORCH_KERNELS, ".json")])
def test_captures_are_written_0600_in_a_0700_directory(tmp_path: Path, tool: CaptureTool, suffix: str) -> None:
    """A user's capture is gzipped; a flight-recorder window's is plain JSON (read once, deleted),
    written under a temporary name, made 0600 and renamed: same mode, nothing left half-written."""
    control = ControlBlock(f"infersight-test-capfiles-{os.getpid()}-{time.monotonic_ns()}", create=True)
    out = tmp_path / "captures" / "nested"
    capture = StepCapture(control, out)
    try:
        control.request(1, tool)
        capture.on_step_begin(7)
        torch.ones(4).sum()
        capture.close()  # the window ends: the trace is written
        assert control.state is CaptureState.DONE, control.path
        trace = Path(control.path)
        assert trace.parent == out and trace.name.endswith(suffix) and trace.stat().st_size > 0
        assert not trace.name.endswith(".shapes.json")
        assert mode(out) == 0o700 and mode(trace) == 0o600
        assert sorted(p.name for p in out.iterdir()) == [trace.name]  # no .part left (no model: no shapes file)
        body = trace.read_bytes()
        assert "traceEvents" in json.loads(gzip.decompress(body) if suffix.endswith(".gz") else body)
        # An existing directory others can write to is refused: the capture fails with a message.
        out.chmod(0o777)
        control.request(1, CaptureTool.TORCH)
        capture.on_step_begin(8)
        capture.close()
        assert control.state is CaptureState.FAILED and "not writable by others" in control.path
    finally:
        capture.close()
        control.close()


def test_a_directory_at_the_token_path_is_one_line_refusal(env: Path) -> None:
    """os.open succeeds on a directory; the refusal must come from the type check, not from a
    traceback when the descriptor is wrapped (issue 33 item 5). Agent and client, through the CLI."""
    from testkit import free_port

    port = free_port()
    path = env / "home" / ".local" / "state" / "infersight" / f"agent-{port}.token"
    path.mkdir(parents=True, mode=0o700)
    path.parent.chmod(0o700)
    for args in (("agent", "--ring", "infersight-test-token-unused", "--listen", f"127.0.0.1:{port}",
                  "--duration", "0.5", "--gpu-source", "none"),
                 ("capture", "--steps", "2", "--agent", f"127.0.0.1:{port}"),
                 ("capture", "--steps", "2", "--agent", f"127.0.0.1:{port}", "--token-file", str(path))):
        res = _agent(env, *args)
        errors = [line for line in res.stderr.splitlines() if line.startswith("infersight: error:")]
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert errors == [f"infersight: error: refusing the token file {path}: not a file; it must be this "
                          f"user's, mode 0600 (remove it and the agent writes a new one)"], res.stderr
    with pytest.raises(TokenFileError, match="not a file"):
        read_token(path)
