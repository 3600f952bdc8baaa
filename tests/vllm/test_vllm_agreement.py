"""A real vLLM (tiny Llama, CPU) with our stat-logger plugin and middleware, the real agent beside it
as a subprocess, and a workload that exercises what the numbers are about: shared prompt prefixes
(prefix cache), ngram speculation, and a KV cache small enough that requests get preempted.

Two references, kept apart. vLLM's own /metrics (read by the test) checks the translation of vLLM's
stats objects, which both it and the agent read. The client's side does not share them: what each
OpenAI response says in its `usage`, how many choices came back, and the test's own clock (e2e, and
TTFT from sending to the first streamed content chunk). The agent's figures come from its /metrics
and JSON API. The vLLM server is the one the live modules share (shared_vllm.py): vLLM's counters are
read as deltas over this module's workload, and the agent starts on a drained ring."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from shared_vllm import BLOCK_SIZE, MODEL, TASKS, SharedVllm
from testkit import free_port, wait_for_process

from infersight.vllm.ids import join_key, key_for_vllm_id
from infersight.vllm.launch import REPO_ROOT

SYSTEM = ["You are a code assistant. def return import class self lambda for while " * 3,
          "Answer in json only. key value json print the cache block token " * 3,
          "Chat with the user kindly. the model decode prefill batch queue kernel " * 3]
N_COMPLETIONS = 30
MAX_TOKENS = 48


@dataclass
class Reply:
    """What the client saw of one call, by its own clock and from the response body alone."""

    status: int
    rid: str
    e2e_s: float                # before sending to after the last byte
    ttft_s: float | None        # streamed: before sending to the first chunk with content; else None
    prompt_tokens: int          # the response's OpenAI usage (a prompt list: summed over its prompts)
    completion_tokens: int
    choices: int                # distinct choice indices returned: the engine requests of the call


@dataclass
class Sent:
    task: str
    trace_id: int        # sent as the traceparent's trace id when traced
    traced: bool
    keys: list[int]      # the engine requests of this call, by join key
    reply: Reply


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (our own servers)
        return resp.read()


def generated(choice: dict) -> list[int]:
    """The token ids a streamed chunk's choice delivers (asked for with vLLM's `return_token_ids`: the
    random tiny model often generates special tokens, whose text is empty, so text alone would miss
    the first token; a chat's first chunk carries only the role)."""
    return choice.get("token_ids") or []


def post(url: str, body: dict, headers: dict[str, str]) -> Reply:
    """One call, timed by the test's clock; streamed ones ask for the generated token ids and the final
    usage chunk, and are read to the end."""
    if body.get("stream"):
        body = {**body, "stream_options": {"include_usage": True}, "return_token_ids": True}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", **headers})
    t0 = time.monotonic()
    ttft: float | None = None
    with urllib.request.urlopen(req, timeout=180) as resp:  # noqa: S310
        if body.get("stream"):
            chunks = []
            for line in resp:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if ttft is None and any(generated(c) for c in chunk.get("choices", [])):
                    ttft = time.monotonic() - t0
                chunks.append(chunk)
        else:
            chunks = [json.loads(resp.read())]
        e2e = time.monotonic() - t0
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1, f"expected one usage object, got {len(usage)}"
    choices = {c["index"] for chunk in chunks for c in chunk.get("choices", [])}
    if body.get("stream"):  # the usage counts what was streamed
        assert sum(len(generated(c)) for chunk in chunks for c in chunk.get("choices", [])) == \
            usage[0]["completion_tokens"]
    return Reply(resp.status, chunks[0]["id"], e2e, ttft, usage[0]["prompt_tokens"], usage[0]["completion_tokens"],
                 len(choices))


def send(base: str, i: int) -> Sent:
    """Request i of the workload: completions behind three shared system prompts (half streamed),
    every third with the caller's traceparent; the last ones are chat, one completion carries a
    list of two prompts and one its caller's X-Request-Id."""
    task = TASKS[i % 3]
    trace_id = (0x1000 + i) << 64 | 0xABCDEF
    headers = {"x-infersight-task": task}
    traced = i % 3 == 0 or i >= N_COMPLETIONS
    if traced:
        headers["traceparent"] = f"00-{trace_id:032x}-{0x51 + i:016x}-01"
    common = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
              "stream": i % 2 == 0}
    if i >= N_COMPLETIONS:
        body = {**common, "messages": [{"role": "user", "content": SYSTEM[2] + f" question {i} " * 8}]}
        reply = post(base + "/v1/chat/completions", body, headers)
        return Sent(task, trace_id, traced, [key_for_vllm_id(reply.rid)], reply)
    prompt = SYSTEM[i % 3] + f" item {i} " * (4 + i % 7)
    if i == 1:
        reply = post(base + "/v1/completions", {**common, "prompt": [prompt, prompt + " again"]}, headers)
        base_id = reply.rid.removeprefix("cmpl-")  # the middleware's id: hex without dashes
        return Sent(task, trace_id, traced, [join_key(base_id, 0), join_key(base_id, 1)], reply)
    if i == 2:  # the caller names the request (dashes and a trailing number: only the engine id is unambiguous)
        reply = post(base + "/v1/completions", {**common, "prompt": prompt}, {**headers, "X-Request-Id": "caller-id-2"})
        assert reply.rid == "cmpl-caller-id-2"
        return Sent(task, trace_id, traced, [join_key("caller-id-2", 0)], reply)
    reply = post(base + "/v1/completions", {**common, "prompt": prompt}, headers)
    return Sent(task, trace_id, traced, [key_for_vllm_id(reply.rid)], reply)


def totals(exposition: str) -> dict[str, float]:
    """Sample name (with the label set for per-position counters) -> value summed over other labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            name = s.name + (f"[{s.labels['position']}]" if "position" in s.labels else "")
            out[name] = out.get(name, 0.0) + s.value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """vLLM's counters over this module's workload alone (the server is shared: shared_vllm.py)."""
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


@pytest.fixture(scope="module")
def run(shared_llama: SharedVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    logs = tmp_path_factory.mktemp("vllm-agreement")
    agent_port = free_port()
    server = shared_llama.server
    agent_log = open(logs / "agent.log", "wb")
    agent = None
    try:
        shared_llama.drain_ring()  # the agent folds this module's requests only
        vllm_before = totals(get(server.url + "/metrics").decode())
        agent = subprocess.Popen([sys.executable, "-m", "infersight", "agent", "--ring", shared_llama.ring, "--listen",
                                  f"127.0.0.1:{agent_port}", "--poll-interval", "0.05"], cwd=REPO_ROOT,
                                 stdout=agent_log, stderr=subprocess.STDOUT)
        agent_url = f"http://127.0.0.1:{agent_port}"
        wait_for_process(agent, lambda: (logs / "agent.log").read_text(errors="replace"), "the agent's /health",
                         lambda: get(agent_url + "/health"), timeout=60)
        with ThreadPoolExecutor(24) as pool:
            sent = list(pool.map(lambda i: send(server.url, i), range(N_COMPLETIONS + 4)))
        engine_requests = sum(len(s.keys) for s in sent)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if json.loads(get(agent_url + "/api/v1/summary"))["requests"] >= engine_requests:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        yield {"sent": sent, "engine_requests": engine_requests,
               "summary": json.loads(get(agent_url + "/api/v1/summary")),
               "vllm": delta(totals(get(server.url + "/metrics").decode()), vllm_before),
               "agent": totals(get(agent_url + "/metrics").decode()),
               "rows": json.loads(get(agent_url + f"/api/v1/requests?slowest={engine_requests + 10}"))["requests"],
               "log": shared_llama.log}
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=20)
        agent_log.close()


def test_workload_exercised_what_it_should(run: dict) -> None:
    v = run["vllm"]
    assert all(s.reply.status == 200 for s in run["sent"])
    assert v["vllm:request_success_total"] == run["engine_requests"]
    assert v["vllm:num_preemptions_total"] > 0, "the small KV cache should have preempted requests"
    assert v["vllm:prefix_cache_hits_total"] > 0 and v["vllm:spec_decode_num_drafts_total"] > 0


def test_agent_agrees_with_vllm_metrics(run: dict) -> None:
    v, a = run["vllm"], run["agent"]
    pairs = {
        "vllm:request_success_total": "infersight_requests_total",
        "vllm:prompt_tokens_total": "infersight_prompt_tokens_total",
        "vllm:generation_tokens_total": "infersight_generation_tokens_total",
        "vllm:prefix_cache_queries_total": "infersight_prefix_cache_queried_tokens_total",
        "vllm:prefix_cache_hits_total": "infersight_prefix_cache_hit_tokens_total",
        "vllm:num_preemptions_total": "infersight_preemptions_total",
        "vllm:spec_decode_num_drafts_total": "infersight_spec_verifications_total",
        "vllm:spec_decode_num_draft_tokens_total": "infersight_spec_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total": "infersight_spec_accepted_tokens_total",
        "vllm:time_to_first_token_seconds_count": "infersight_time_to_first_token_seconds_count",
    }
    for pos in range(3):
        theirs = f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{pos}]"
        pairs[theirs] = f"infersight_spec_position_accepted_total[{pos}]"
    got = {ours: a.get(ours, 0.0) for ours in pairs.values()}
    want = {ours: v[theirs] for theirs, ours in pairs.items()}
    assert got == want
    assert a["infersight_probe_events_dropped_total"] == 0


def test_rebuilt_timings_keep_vllm_intervals(run: dict) -> None:
    """e2e without the network part is vLLM's e2e by construction (to the ns); TTFT is rebuilt
    (translate.py) and stays within a few ms of vLLM's per request, network lead included."""
    v, rows, n = run["vllm"], run["rows"], run["engine_requests"]
    engine_e2e = sum(r["e2e_s"] - r["network_s"] for r in rows)
    assert engine_e2e == pytest.approx(v["vllm:e2e_request_latency_seconds_sum"], abs=1e-6 * n)
    ours = run["agent"]["infersight_time_to_first_token_seconds_sum"]
    ttft_gap = (ours - v["vllm:time_to_first_token_seconds_sum"]) / n
    assert abs(ttft_gap) < 0.1, f"mean TTFT gap {ttft_gap * 1e3:.1f} ms"


def test_agent_counts_agree_with_the_client(run: dict) -> None:
    """Request count and tokens against the client's side: choices returned and each response's `usage`,
    in total and per call (a call's rows, by join key, against its own usage)."""
    sent, a, rows = run["sent"], run["agent"], {r["request_id"]: r for r in run["rows"]}
    client_requests = sum(s.reply.choices for s in sent)
    assert run["summary"]["requests"] == a["infersight_requests_total"] == len(rows) == client_requests
    assert a["infersight_prompt_tokens_total"] == sum(s.reply.prompt_tokens for s in sent)
    assert a["infersight_generation_tokens_total"] == sum(s.reply.completion_tokens for s in sent)
    for s in sent:
        assert len(s.keys) == s.reply.choices
        assert sum(rows[k]["prompt_tokens"] for k in s.keys) == s.reply.prompt_tokens, s
        assert sum(rows[k]["output_tokens"] for k in s.keys) == s.reply.completion_tokens, s


#: How far the agent's TTFT of a request may exceed the client's. Only one term can make it exceed:
#: the agent's TTFT runs from the middleware's receipt R to T' = T + d_last (translate.py rebuilds the
#: first-token instant T as F - decode, late by d_last, the lag from the engine core's last step of the
#: request to the API server's processing of it); the client's runs from its send (<= R) to its first
#: chunk with a generated token, which the API server streams only after processing the first token's
#: step (>= T + d_first). So agent - client <= d_last - d_first <= d_last: the wait of one step's output
#: between the engine-core process and the API server's output handler, under a step unless that event
#: loop falls a whole step behind. 50 ms is about two decode steps of the tiny Llama here (~250 tok/s
#: over 8 streams, VLLM.md). Both are time.monotonic() durations on one host: no clock offset enters.
#: Measured (2 runs, 17 streamed calls each, loaded 2-core machine, 2026-12-03): at most -1.3 ms.
TTFT_ALLOWANCE_S = 0.05
#: How far the agent's TTFTs may fall short of the client's, for the median call: a gross-error bound.
#: The shortfall is (R - send) + (first chunk received - T'): the connection and request parsing before
#: the middleware, and d_first - d_last, the API server's delay in streaming the first token, which the
#: agent's T' does not see (translate.py), then 24 Python client threads reading SSE on two shared cores.
#: No other clock measures it, so there is no tight bound, and a stall of the API server's event loop
#: can make one call's large: measured medians 30 and 62 ms, single calls up to 1.1 s (one of 17).
#: It catches gross errors only: a queue of seconds lost (as the small KV cache made in one run), or
#: rows joined to the wrong requests.
TTFT_MEDIAN_SHORTFALL_BOUND_S = 0.5


def test_agent_ttft_agrees_with_the_client_stream_clock(run: dict) -> None:
    """Per streamed call (joined by request id): the agent's TTFT against the client's stream clock."""
    rows = {r["request_id"]: r for r in run["rows"]}
    streamed = [s for s in run["sent"] if s.reply.ttft_s is not None]
    assert len(streamed) == 17 and all(len(s.keys) == 1 for s in streamed)  # the even calls: 0, 2, ..., 32
    client = [s.reply.ttft_s for s in streamed]
    agent = [rows[s.keys[0]]["ttft_s"] for s in streamed]
    excess = sorted(a - c for a, c in zip(agent, client))
    shown = ", ".join(f"{x * 1e3:.1f}" for x in excess)
    pairs = ", ".join(f"{c * 1e3:.0f}/{a * 1e3:.0f}" for c, a in sorted(zip(client, agent)))
    print(f"client/agent TTFT over {len(excess)} streamed calls, ms: {pairs}\nagent - client, ms: {shown}")
    assert all(a > 0 for a in agent)
    assert excess[-1] <= TTFT_ALLOWANCE_S, f"agent TTFT over the client's by more than the allowance (ms): {shown}"
    median_shortfall = -excess[len(excess) // 2]
    assert median_shortfall <= TTFT_MEDIAN_SHORTFALL_BOUND_S, f"agent TTFTs far below the client's (ms): {shown}"


#: The middleware stamps the last byte after its `await send(...)` returns (vllm/middleware.py, on_sent), so
#: a client can have read the byte, and stopped its clock, before the server's coroutine runs again and
#: stamps it: the server's e2e may exceed the client's by that wait on the API server's event loop. One
#: suite run (loaded 2-core machine, 2026-12-05) saw 0.94 ms; 50 ms, as TTFT_ALLOWANCE_S, is a loop that
#: fell a whole step behind. A row joined to the wrong call would be off by far more.
LAST_BYTE_STAMP_LAG_S = 0.05


def test_task_trace_and_network_reach_the_rows(run: dict) -> None:
    rows = {r["request_id"]: r for r in run["rows"]}
    assert len(rows) == run["engine_requests"]
    assert sum(s.traced for s in run["sent"]) == 14  # requests 0, 3, ..., 27 and the four chats
    for s in run["sent"]:
        for key in s.keys:
            row = rows[key]
            assert row["task"] == s.task
            if s.traced:
                assert row["trace_id"] == f"{s.trace_id:032x}"
            assert row["network_s"] >= 0
            # The client's own clock brackets the server's: sent before it was received, read
            # after the last byte left (up to the stamp's lag); the engine's part is inside both.
            assert s.reply.e2e_s + LAST_BYTE_STAMP_LAG_S >= row["e2e_s"] >= row["e2e_s"] - row["network_s"] > 0
            assert row["output_tokens"] == MAX_TOKENS


def test_kv_geometry_matches_vllm(run: dict) -> None:
    """vLLM logs its KV cache size in tokens; the steps carry it as usable blocks (less vLLM's null block)."""
    sized = re.search(r"KV cache size: ([\d,]+) tokens", run["log"].read_text(errors="replace"))
    assert sized is not None
    kv = run["summary"]["kv"]
    assert kv["blocks_total"] == int(sized.group(1).replace(",", "")) // BLOCK_SIZE - 1
    assert 0 <= kv["blocks_in_use"] <= kv["blocks_total"]


def test_one_thread_writes_the_ring(run: dict) -> None:
    """The stat logger and the middleware run on the API server's event loop: one producer."""
    lines = [ln for ln in run["log"].read_text(errors="replace").splitlines() if "written from thread" in ln]
    assert len(lines) == 1, lines
