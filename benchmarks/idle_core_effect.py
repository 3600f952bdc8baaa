"""Does a busy neighbour make `serve` faster on this machine? A check of the serving benchmark's method.

`bench serving` on the 2-core CPU VM measured the `full` arm (an agent using ~0.4 cores beside serve)
*faster* than no agent in 5 of 5 rounds (1.081). One explanation is the machine, not infersight: on a VM an
idle virtual CPU halts, and waking it for the engine's next thread hand-off (torch's intra-op threads, the
front end's ZeroMQ messages) costs time that a CPU kept busy does not pay. This script tests that alone:
one `infersight serve`, closed-loop clients (bench serving's), and phases alternating between nothing
beside serve and a low-priority spinner (`nice -n 19`, pure Python, no I/O, no infersight) that keeps a core
from going idle. Tokens/s by the clients' clock, per pair the ratio spinner / none; all measured.

    python benchmarks/idle_core_effect.py --pairs 6 --phase-s 20

If the spinner's phases are faster, a cost measured by adding load on this machine is biased low (an
arm's own CPU use can speed serving). On the 2-core VM (2026-12-05) they were, 1.19x in 6 of 6 pairs; a
spinner beside every arm of `bench serving` did not narrow its A/A floor there (0.86-1.07), so the cure
is a machine without the effect, not a spinner (BENCHMARKS.md). Prints one line per phase, then one JSON
object as the last line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infersight.bench.agent import stop_agent  # noqa: E402
from infersight.bench.serving.processes import free_port, wait_health  # noqa: E402
from infersight.bench.serving.clients import phase_figures, run_phase  # noqa: E402
from infersight.bench.serving.config import ServingBenchConfig  # noqa: E402

#: Lowest priority, pure Python, no I/O: it only keeps a CPU from going idle.
SPINNER = "import os\nos.nice(19)\nwhile True:\n    pass\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--phase-s", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="infersight-idle-core-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = ServingBenchConfig(clients=args.clients, max_tokens=args.max_tokens, phase_s=args.phase_s,
                                warmup_s=args.warmup_s)
    with open(out / "serve.log", "w") as log:
        serve = subprocess.Popen([sys.executable, "-m", "infersight", "serve", "--listen", f"127.0.0.1:{port}",
                                  "--model", "tiny-moe", "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT)
    phases = []
    try:
        wait_health(url, serve, "infersight serve", out / "serve.log", timeout_s=600)
        run_phase(url, ServingBenchConfig(**{**config.__dict__, "phase_s": 5.0}), seed=-1)  # warm
        for pair in range(args.pairs):
            order = ("none", "spinner") if pair % 2 == 0 else ("spinner", "none")
            for arm in order:
                spinner = subprocess.Popen([sys.executable, "-c", SPINNER]) if arm == "spinner" else None
                try:
                    records, t0, t1 = run_phase(url, config, seed=1000 + 2 * pair + (arm == "spinner"))
                finally:
                    if spinner is not None:
                        spinner.kill()
                        spinner.wait()
                tok = pd.DataFrame(records.tokens, columns=["request", "t_s"])
                req = pd.DataFrame(records.requests, columns=["request", "sent_s", "first_s", "done_s", "tokens", "status"])
                fig = phase_figures(tok, req, t0, t1)
                phases.append({"pair": pair, "arm": arm, **fig})
                print(f"pair {pair} {arm:<8} {fig['tokens_per_s']:8.1f} tok/s TTFT p50 {fig['ttft_p50_s'] * 1e3:6.1f} ms "
                      f"ITL p50 {fig['itl_p50_s'] * 1e3:5.1f} ms", flush=True)
    finally:
        stop_agent(serve)
    frame = pd.DataFrame(phases)
    by = frame.pivot(index="pair", columns="arm", values="tokens_per_s")
    ratios = (by["spinner"] / by["none"]).tolist()
    print(json.dumps({"measured": True, "how": "clients' clock; ratio spinner / none per adjacent pair",
                      "ratios": ratios, "median_ratio": statistics.median(ratios),
                      "spinner_faster_in": sum(r > 1 for r in ratios), "pairs": len(ratios),
                      "phases": phases}, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
