"""The agent's exposition on the demo workload is byte-identical to the one before the AgentConfig
split (issue 31): exposition_snapshot.py replays a recorded probe-record stream into a real agent on a
fixed clock, and its /metrics text is compared with snapshots/demo_exposition.txt, which the same
script wrote on the commit before the split (the header names it).

When a change adds or changes a metric on purpose, the comparison fails: rewrite the snapshot with
`python tests/agent/exposition_snapshot.py --write --commit HASH` on the commit before the change,
and say so in the commit."""
from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

from exposition_snapshot import HEADER, SNAPSHOT

HERE = Path(__file__).parent


def test_the_exposition_is_byte_identical() -> None:
    """In a subprocess: the replay sets the time module's clocks, which no other test's threads may see."""
    root = HERE.parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests"), str(HERE)])}
    run = subprocess.run([sys.executable, str(HERE / "exposition_snapshot.py")], capture_output=True, env=env,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    before = "".join(line for line in SNAPSHOT.read_text().splitlines(keepends=True) if not line.startswith(HEADER))
    now = run.stdout.decode()
    diff = "".join(difflib.unified_diff(before.splitlines(keepends=True), now.splitlines(keepends=True),
                                        "before (snapshot)", "now", n=1))
    assert now.encode() == before.encode(), diff[:4000]
