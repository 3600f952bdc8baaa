"""`infersight mcp`'s failures, each one line and never a hang: bad flags (exit 2, before the SDK
loads), an HTTP server without a trustworthy token file, and an agent that never answers (a tool
error within the timeout: the server never waits on the agent longer than --timeout)."""
from __future__ import annotations

import asyncio
import socket
import subprocess
import time

import pytest
from mcp import Client
from mcp_session import mcp_command

from mcp_live_agent import ENV, REPO
from infersight.agent.api.token_file import TokenFileError
from infersight.cli import main
from infersight.mcp.config import McpConfig
from infersight.mcp.server import build_server, serve


def test_a_bad_flag_is_one_line_and_exit_2() -> None:
    res = subprocess.run(mcp_command("--agent", "ftp://x"), cwd=REPO, env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == ["infersight: error: --agent must be an http(s)://HOST:PORT URL, "
                                               "got 'ftp://x'"]


@pytest.mark.parametrize("args,words", [(["--listen", "nonsense"], "--listen must be"),
                                        (["--timeout", "0"], "--timeout must be"),
                                        (["--transport", "sse"], "invalid choice")])
def test_other_bad_flags_are_one_line_and_exit_2(args: list[str], words: str, capsys) -> None:
    try:
        code = main(["mcp", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_http_without_a_token_file_is_refused(tmp_path) -> None:
    config = McpConfig(transport="streamable-http", token_file=tmp_path / "missing.token")
    with pytest.raises(TokenFileError, match="missing.token"):
        serve(config)


def test_an_agent_that_never_answers_is_a_tool_error_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        server = build_server(McpConfig(agent_url=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5))

        async def call() -> tuple[object, float]:
            async with Client(server) as client:
                start = time.monotonic()
                result = await client.call_tool("summary", {})
                return result, time.monotonic() - start

        result, took = asyncio.run(call())
    assert result.is_error and "did not answer /api/v1/summary within 0.5 s" in result.content[0].text
    assert took < 10  # the bound, with room for a loaded machine
