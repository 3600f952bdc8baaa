"""`infersight bench serving --switchback-block-s S`: each arm as one phase of switchback blocks (bench.serving.switchback).

One `serve`, warmed up once. Per arm, one phase of closed-loop clients (serving_clients) while this thread
switches the arm at each block's start and notes when the switch happened:

    none_again      nothing (the method's A/A floor)
    agent, ...      the arm's `infersight agent`, started before the phase: SIGCONT in "on" blocks, SIGSTOP
                    in "off" ones (the engine's ring keeps the records a stopped agent has not read; it reads
                    them when it runs again, so its work lands in the on blocks)
    engine_paused   serve's engine process stopped for calibration_pause of every PAUSE_PERIOD_S in on blocks:
                    a loss known in advance. Its expected ratio comes from the pauser's own record of when
                    the engine was stopped, (1 - stopped share of on time) / (1 - stopped share of off time),
                    taking a stopped engine to make no tokens (the clients' closed loop keeps it saturated).

A recorder arm's windows all fall in on blocks: the agent earns its budget from every engine step it reads,
stopped blocks included. So its on-block loss, by its own measure, is the cost seconds its windows took in the
phase over the on blocks' seconds: reported beside the clients' on-block loss (1 - ratio).
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from infersight.bench.agent import stop_agent
from infersight.bench.serving.otlp_sink import OtlpSink
from infersight.bench.serving.process_cpu import spawned_children
from infersight.bench.serving.clients import PhaseRecords, run_phase
from infersight.bench.serving.config import CALIBRATION_ARM, PAUSE_PERIOD_S, REFERENCE, ServingBenchConfig
from infersight.bench.serving.processes import agent_cmd, agent_figures, free_port, start_serve, wait_health
from infersight.bench.serving.report import RESOLVE
from infersight.bench.serving.switchback import HOW, block_figures, latency_by_state, switchback_states, switchback_summary


class StopSwitch:
    """A process running in on blocks and stopped (SIGSTOP) in off ones; None: a switch that does nothing."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def set(self, state: str) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT if state == "on" else signal.SIGSTOP)

    def close(self) -> None:
        self.set("on")


class EnginePause:
    """While on: the process stopped for share x period_s of every period_s; `stops` records each
    (start, end), monotonic seconds, as this thread saw them."""

    def __init__(self, pid: int, share: float, period_s: float = PAUSE_PERIOD_S) -> None:
        self.pid, self.share, self.period_s = pid, share, period_s
        self.stops: list[tuple[float, float]] = []
        self._on, self._closed = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-pause", daemon=True)
        self._thread.start()

    def set(self, state: str) -> None:
        (self._on.set if state == "on" else self._on.clear)()

    def _run(self) -> None:
        while not self._closed.is_set():
            if not self._on.wait(0.01):
                continue
            time.sleep(self.period_s * (1 - self.share))
            if not self._on.is_set() or self._closed.is_set():
                continue
            start = time.monotonic()
            os.kill(self.pid, signal.SIGSTOP)
            try:
                time.sleep(self.period_s * self.share)
            finally:
                os.kill(self.pid, signal.SIGCONT)
                self.stops.append((start, time.monotonic()))

    def close(self) -> None:
        self._closed.set()
        self._on.set()
        self._thread.join()


def stopped_share(stops: list[tuple[float, float]], blocks: pd.DataFrame) -> dict[str, float]:
    """The share of each state's block time that the stops cover: {"on": ..., "off": ...}."""
    out = {}
    for state, g in blocks.groupby("state"):
        covered = sum(max(0.0, min(e, b_end) - max(s, b_start))
                      for b_start, b_end in zip(g["start_s"], g["end_s"]) for s, e in stops)
        out[str(state)] = covered / float((g["end_s"] - g["start_s"]).sum())
    return out


#: The arms whose agent runs the flight recorder (serving_processes.agent_cmd).
RECORDER_ARMS = ("agent_recorder", "full")


def _counter(figures: dict[str, float], key: str, has: bool) -> float:
    value = figures.get(key, float("nan"))
    return 0.0 if has and value != value else value


def run_blocks(url: str, config: ServingBenchConfig, switch: Any, seed: int,
               on_blocks_start: Callable[[], None] = lambda: None) -> tuple[PhaseRecords, pd.DataFrame]:
    """One phase: clients run over warm-up + 2 x pairs blocks (and a second after, so the last block is
    loaded to its end); this thread switches at each block's start. on_blocks_start runs once, right
    before the first switch."""
    states = switchback_states(config.switchback_pairs, seed)
    block_s = config.switchback_block_s
    phase = ServingBenchConfig(**{**config.__dict__, "phase_s": config.warmup_s + len(states) * block_s + 1.0})
    result: dict[str, Any] = {}
    clients = threading.Thread(target=lambda: result.update(zip(("records", "t0", "t1"), run_phase(url, phase, seed))))
    begin = time.monotonic() + config.warmup_s
    clients.start()
    rows = []
    try:
        time.sleep(max(0.0, begin - time.monotonic()))
        on_blocks_start()
        begin = time.monotonic()
        for i, state in enumerate(states):
            switch.set(state)
            start = time.monotonic()
            if rows:
                rows[-1]["end_s"] = start
            rows.append({"pair": i // 2, "state": state, "start_s": start, "end_s": float("nan")})
            time.sleep(max(0.0, begin + (i + 1) * block_s - time.monotonic()))
        rows[-1]["end_s"] = time.monotonic()
    finally:
        switch.set("on")
        clients.join()
    return result["records"], pd.DataFrame(rows)


def bench_serving_switchback(config: ServingBenchConfig, log: Any = print) -> dict[str, Any]:
    """Every arm but the reference (and the calibration arm when asked) as switchback phases; the report
    per arm (module docstring), with the raw frames under "frames"."""
    out_dir = Path(tempfile.mkdtemp(prefix="infersight-bench-switchback-"))
    ring, port = f"infersight-bench-serving-{free_port()}", free_port()
    url = f"http://127.0.0.1:{port}"
    serve_log = open(out_dir / "serve.log", "w")
    serve = start_serve(config, ring, port, serve_log)
    sink = OtlpSink() if "full" in config.arms else None
    arms = [a for a in config.arms if a != REFERENCE] + ([CALIBRATION_ARM] if config.calibration_pause > 0 else [])
    frames: dict[str, list[pd.DataFrame]] = {"blocks": [], "tokens": [], "requests": []}
    extra: dict[str, dict[str, Any]] = {arm: {} for arm in arms}
    try:
        wait_health(url, serve, "infersight serve", out_dir / "serve.log")
        run_phase(url, ServingBenchConfig(**{**config.__dict__, "phase_s": 2.0 + config.warmup_s}), seed=-1)
        engine_pid = next(iter(spawned_children(serve.pid)), serve.pid)  # serve's engine process when split
        for rnd in range(config.rounds):
            for arm in arms[rnd % len(arms):] + arms[:rnd % len(arms)]:
                agent, agent_url, before = None, "", {}
                if arm not in ("none_again", CALIBRATION_ARM):
                    aport = free_port()
                    agent_url = f"http://127.0.0.1:{aport}"
                    with open(out_dir / f"agent_{rnd}_{arm}.log", "w") as agent_log:
                        agent = subprocess.Popen([*agent_cmd(arm, ring, aport, out_dir, sink), *config.agent_args],
                                                 stdout=agent_log, stderr=subprocess.STDOUT)
                    wait_health(agent_url, agent, "infersight agent", out_dir / f"agent_{rnd}_{arm}.log")
                switch = (EnginePause(engine_pid, config.calibration_pause) if arm == CALIBRATION_ARM
                          else StopSwitch(agent.pid if agent is not None else None))
                try:
                    records, blocks = run_blocks(
                        url, config, switch, seed=config.seed * 1000 + rnd,
                        on_blocks_start=lambda: before.update(agent_figures(agent_url) if agent_url else {}))
                finally:
                    switch.close()
                    after = agent_figures(agent_url) if agent is not None else {}
                    if agent is not None:
                        stop_agent(agent)
                blocks = blocks.assign(arm=arm, round=rnd, pair=blocks["pair"] + rnd * config.switchback_pairs)
                tok = pd.DataFrame(records.tokens, columns=["request", "t_s"]).assign(arm=arm, round=rnd)
                req = pd.DataFrame(records.requests, columns=["request", "sent_s", "first_s", "done_s", "tokens",
                                                              "status"]).assign(arm=arm, round=rnd)
                frames["blocks"].append(block_figures(blocks, tok))
                frames["tokens"].append(tok)
                frames["requests"].append(req)
                for key in ("cost_s", "windows", "ring_dropped"):
                    # A counter not yet exported reads 0 where the arm has it (a recorder that took no window).
                    has = agent is not None and (key == "ring_dropped" or arm in RECORDER_ARMS)
                    extra[arm][key] = extra[arm].get(key, 0.0) + (_counter(after, key, has) - _counter(before, key, has))
                extra[arm]["recorder_cost_ratio"] = after.get("cost_ratio", float("nan"))
                if isinstance(switch, EnginePause):
                    share = stopped_share(switch.stops, blocks)
                    extra[arm].setdefault("stops", []).extend(switch.stops)
                one = switchback_summary(frames["blocks"][-1])
                log(f"round {rnd} {arm:<15} on/off tokens/s {one['tokens_per_s_ratio']:.4f} over {one['pairs']} "
                    f"pairs, totals {one['tokens_per_s_ratio_of_totals']:.4f} ({one['tokens_per_s_on']:.1f} / "
                    f"{one['tokens_per_s_off']:.1f} tok/s)" + (f"; engine stopped {share['on']:.4f} of on time, "
                                                              f"{share.get('off', 0.0):.4f} of off" if arm == CALIBRATION_ARM else ""))
    finally:
        if sink is not None:
            sink.close()
        stop_agent(serve)
        serve_log.close()
    blocks = pd.concat(frames["blocks"], ignore_index=True)
    tokens = pd.concat(frames["tokens"], ignore_index=True)
    requests = pd.concat(frames["requests"], ignore_index=True)
    report_arms = {}
    for arm in arms:
        b, t, r = (f[f["arm"] == arm] for f in (blocks, tokens, requests))
        figures = {**switchback_summary(b), **latency_by_state(b, t, r),
                   "errors": int((r["status"] != 200).sum()), "recorder_cost_ratio": extra[arm]["recorder_cost_ratio"],
                   "recorder_windows": extra[arm]["windows"], "ring_dropped": extra[arm]["ring_dropped"]}
        # The recorder's own measure of its on-block loss (module docstring): modelled from its cost seconds.
        figures["recorder_on_loss_modelled"] = extra[arm]["cost_s"] / figures["on_s"]
        if arm == CALIBRATION_ARM:
            share = stopped_share(extra[arm]["stops"], b)
            figures.update(stopped_share_on=share["on"], stopped_share_off=share.get("off", 0.0),
                           expected_ratio=(1 - share["on"]) / (1 - share.get("off", 0.0)))
        report_arms[arm] = figures
    floor = report_arms.get("none_again", {})
    return {"measured": True, "method": "switchback", "how": HOW, "config": dict(config.__dict__),
            "arms": report_arms,
            "aa_floor": {"tokens_per_s_ratio": floor.get("tokens_per_s_ratio", float("nan")),
                         "tokens_per_s_ratio_interval": floor.get("tokens_per_s_ratio_interval", [float("nan")] * 2)},
            "frames": {"blocks": blocks, "tokens": tokens, "requests": requests}, "out_dir": str(out_dir)}


def print_switchback_report(report: dict[str, Any]) -> None:
    print(f"{'arm':<15} {'pairs':>5} {'on/off':>7} {'interval':>15} {'totals':>7} {'tok/s on':>9} {'off':>9} "
          f"{'ITL p99 on':>10} {'off':>7} {'TTFT p99 on':>11} {'off':>7}  recorder on-block loss (modelled)")
    for arm, a in report["arms"].items():
        low, high = a["tokens_per_s_ratio_interval"]
        modelled = a["recorder_on_loss_modelled"]
        print(f"{arm:<15} {a['pairs']:>5} {a['tokens_per_s_ratio']:>7.4f} {low:>7.4f}-{high:<7.4f} "
              f"{a['tokens_per_s_ratio_of_totals']:>7.4f} {a['tokens_per_s_on']:>9.1f} {a['tokens_per_s_off']:>9.1f} "
              f"{a['itl_p99_s_on'] * 1e3:>8.1f}ms {a['itl_p99_s_off'] * 1e3:>5.1f}ms {a['ttft_p99_s_on'] * 1e3:>9.0f}ms "
              f"{a['ttft_p99_s_off'] * 1e3:>5.0f}ms  " + (f"{modelled:.4f} ({a['recorder_windows']:.0f} windows)"
                                                          if modelled == modelled else "-"))
    for arm, a in report["arms"].items():
        verdict = ("too few pairs for an interval" if a["resolves"] is None else
                   ("resolves" if a["resolves"] else "does not resolve") + f" {RESOLVE:.1%}")
        line = f"{arm:<15} client on-block loss {1 - a['tokens_per_s_ratio']:+.4f} (measured), {verdict}"
        if a.get("expected_ratio") is not None:
            line += f"; known answer {1 - a['expected_ratio']:+.4f} (engine stopped {a['stopped_share_on']:.4f} of on time)"
        if a["recorder_on_loss_modelled"] == a["recorder_on_loss_modelled"]:
            line += f"; the recorder's own figure {a['recorder_on_loss_modelled']:+.4f} (modelled)"
        print(line)
    print("measured: " + report["how"])
