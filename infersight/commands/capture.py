"""`infersight capture --steps N`: ask a running agent for a capture of the engine's next N steps."""
from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from infersight.agent.capture.controller import default_token_file
    from infersight.agent.api.token_file import read_token
    from infersight.commands.agent import parse_listen

    host, port = parse_listen(args.agent)
    token_file = Path(args.token_file) if args.token_file else default_token_file(port)
    if not os.path.lexists(token_file):  # any other shape (directory, link, FIFO) is refused by read_token
        raise ValueError(f"no token file at {token_file}; pass --token-file (the agent writes it at start)")
    token = read_token(token_file)  # this user's and 0600, or a one-line refusal
    base = f"http://{host}:{port}"
    req = urllib.request.Request(base + "/api/v1/capture", method="POST",
                                 data=json.dumps({"steps": args.steps, "tool": args.tool}).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        record = json.loads(urllib.request.urlopen(req, timeout=10).read())
    except urllib.error.HTTPError as exc:
        raise ValueError(f"the agent refused: {json.loads(exc.read()).get('error', exc.reason)}") from None
    except OSError as exc:
        raise ValueError(f"cannot reach the agent at {base}: {exc}") from None
    print(f"capture {record['capture_id']} requested on {record['ring']} ({args.steps} steps, {args.tool})")
    deadline = time.monotonic() + args.wait
    while args.wait and time.monotonic() < deadline:
        records = json.loads(urllib.request.urlopen(base + "/api/v1/captures", timeout=10).read())["captures"]
        mine = next(r for r in records if r["capture_id"] == record["capture_id"] and r["ring"] == record["ring"])
        if mine["state"] in ("done", "failed"):
            print(json.dumps(mine, indent=2))
            return 0 if mine["state"] == "done" else 1
        time.sleep(0.5)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    cap = sub.add_parser("capture", help="ask the agent to profile the engine's next N steps")
    cap.add_argument("--steps", type=int, default=20)
    cap.add_argument("--tool", default="torch", choices=["torch", "cuda-profiler"])
    cap.add_argument("--agent", default="127.0.0.1:9464", help="the agent's HOST:PORT")
    cap.add_argument("--token-file", help="the agent's token file (default: the agent's default path for its port)")
    cap.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the result (0: don't wait)")
    cap.set_defaults(func=run)
