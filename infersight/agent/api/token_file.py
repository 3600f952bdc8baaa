"""The capture token's file: in a directory only this user can enter, checked before it is trusted.

Default place: ``$XDG_RUNTIME_DIR/infersight/agent-PORT.token`` when that runtime directory is
this user's and private (as the XDG spec has it), else ``${XDG_STATE_HOME:-~/.local/state}/
infersight/``: never a predictable path in a shared /tmp, where another user could create the
directory first and plant a token. The directory is created 0700, the file 0600; an existing
directory or file is used only when this user owns it and nobody else can read or write it
(no symlinks). Anything else is refused with one line saying what to fix.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from infersight.config_error import ConfigError

#: A token file longer than this is not one of ours.
MAX_TOKEN_BYTES = 4096


class TokenFileError(ConfigError):
    """The token file, or its directory, cannot be trusted (owner, mode, type) or read."""


def _private_dir(path: str) -> bool:
    """Is ``path`` a real directory of this user that nobody else can enter?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def default_token_dir() -> Path:
    """Where the agent keeps its token files (see the module docstring); not created here."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and _private_dir(runtime):
        return Path(runtime) / "infersight"
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "infersight"


def default_token_file(port: int) -> Path:
    """The token file of the agent listening on ``port``."""
    return default_token_dir() / f"agent-{port}.token"


def _why_untrusted(st: os.stat_result, kind: str, group_other: int) -> str | None:
    uid = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if kind == "directory" and not stat.S_ISDIR(st.st_mode) or kind == "file" and not stat.S_ISREG(st.st_mode):
        return f"not a {kind}"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & group_other:
        return f"mode {stat.S_IMODE(st.st_mode):04o}: others can {'write to' if group_other == 0o022 else 'use'} it"
    return None


def check_token_dir(path: Path, private: bool) -> None:
    """Create ``path`` (0700) if missing; refuse it unless it is this user's directory and (with
    ``private``) nobody else's to enter, else (a directory the user named) nobody else's to write."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(path)
    except OSError as exc:
        raise TokenFileError(f"cannot create the token directory {path}: {exc.strerror}") from None
    why = _why_untrusted(st, "directory", 0o077 if private else 0o022)
    if why is not None:
        need = "mode 0700" if private else "not writable by others"
        raise TokenFileError(f"refusing the token directory {path}: {why}; it must be this user's, {need} "
                             f"(chmod 700 {path})")


def read_token(path: Path) -> str:
    """The token in ``path``, after checking the file is this user's and private (0600)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "a symbolic link" if os.path.islink(path) else exc.strerror
        raise TokenFileError(f"refusing the token file {path}: {why}") from None
    # The type is checked on the descriptor before any file object wraps it: os.open succeeds on a
    # directory, and os.fdopen of that descriptor raises IsADirectoryError (a traceback, not a refusal).
    why = _why_untrusted(os.fstat(fd), "file", 0o077)
    if why is not None:
        os.close(fd)
        raise TokenFileError(f"refusing the token file {path}: {why}; it must be this user's, mode 0600 "
                             f"(remove it and the agent writes a new one)")
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_TOKEN_BYTES + 1)
    token = raw.decode("ascii", errors="replace").strip()
    if not token or len(raw) > MAX_TOKEN_BYTES or not token.isprintable() or " " in token:
        raise TokenFileError(f"refusing the token file {path}: it does not hold one token (printable ASCII, "
                             f"at most {MAX_TOKEN_BYTES} bytes)")
    return token


def load_or_create_token(path: Path, private_dir: bool = True) -> str:
    """The token in ``path``, or a new one written there (0600) in a checked directory.
    ``private_dir``: the directory must be 0700 (the default place); False for a file the user
    named, whose directory need only be theirs and not writable by others."""
    check_token_dir(path.parent, private_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return read_token(path)
    except OSError as exc:
        raise TokenFileError(f"cannot write the token file {path}: {exc.strerror}") from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
