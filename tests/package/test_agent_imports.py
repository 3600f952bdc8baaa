"""The agent process loads only what it uses at steady state (issue 17: RSS <= 150 MB): no pyarrow
(pandas would load it; only --parquet-dir needs it), no torch, no rich, no OpenTelemetry unless
tracing is on. Read from the running process's own memory map, not from our code's say-so."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from testkit import free_port


def mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_agent_process_maps_no_pyarrow_torch_or_rich(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "infersight", "agent", "--ring", f"infersight-imports-{os.getpid()}",
                             "--listen", f"127.0.0.1:{port}", "--gpu-source", "none"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/summary", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the agent did not start"
                time.sleep(0.1)
        maps = mapped_libraries(proc.pid)
        rss_kb = int(next(ln for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                          if ln.startswith("VmRSS:")).split()[1])
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert "libarrow" not in maps and "/pyarrow/" not in maps
    assert "libtorch" not in maps and "/torch/" not in maps
    assert "/rich/" not in maps and "/opentelemetry/" not in maps
    assert "/pandas/" in maps  # the check above reads the right thing: pandas is there
    assert rss_kb < 120 * 1024, f"idle agent RSS {rss_kb / 1024:.0f} MB"


def test_pandas_without_pyarrow_still_reads_strings_and_pyarrow_stays_importable() -> None:
    code = ("import sys\n"
            "from infersight.agent.lean_imports import import_pandas_without_pyarrow\n"
            "assert import_pandas_without_pyarrow()\n"
            "import pandas as pd\n"
            "assert 'pyarrow' not in sys.modules\n"
            "df = pd.DataFrame({'task': ['code', 'chat', 'code'], 'n': [1, 2, 3]})\n"
            "assert df.groupby('task', sort=True)['n'].sum().to_dict() == {'chat': 2, 'code': 4}\n"
            "assert str(df['task'].dtype) == 'str'\n"
            "import pyarrow\n"  # --parquet-dir, a report: whoever asks for it by name gets it
            "assert not import_pandas_without_pyarrow()\n")  # pandas loaded: nothing to do
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
