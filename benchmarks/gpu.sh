#!/usr/bin/env bash
# The GPU runs, one suite per device call, named by what it checks:
#   bash benchmarks/gpu.sh SUITE [SUITE ...]      (device tool, carry [".whl"]; .before too for observer_cost)
# Each suite logs to $OUT/SUITE.log and leaves its JSON under $OUT. The dated run_gpu_*.sh scripts of
# 2026-11-29..12-01 were folded in here; BENCHMARKS.md cites the commit that holds each of them.
#
#   gpu_tests     the CUDA tests of the runtime (graphs, fused forward, async scheduling, sampling,
#                 the Triton decode kernel, MoE experts, profiled decode) and benchmarks/gpu_check.py
#   decode        `bench runtime` decode steps, llama-1b-shape batch 32 and 1, async scheduling, with
#                 the eager comparison and the Hugging Face anchor
#   probe_cost    probes on/off on the fast engine, sync and async (benchmarks/probe_cost.py), one
#                 recorder window's cost by blocks (benchmarks/window_cost.py)
#   observer_cost the observer's CPU time per batch-32 step against a before tree in .before/
#                 (benchmarks/observer_cost.py, benchmarks/ingest_ab.py; skipped without .before)
#   captures      what a capture costs and leaves behind (benchmarks/capture_check.py,
#                 benchmarks/profiler_residue.py)
#   speculation   the CUDA-graph tests; `bench speculation` on CUDA (measured A/B, batch 4 and 16)
#                 against the demo's predictions on CUDA; meanwhile, on CPU cores 8-15, the
#                 calibration runs of spec_speedup.MODEL_ERROR (benchmarks/spec_calibration.py)
#   ceilings      `bench ceilings` on CUDA (bf16, then float32), then `analyze` naming the ceiling
#   speculation_check  `bench speculation` on CUDA at another seed: the CUDA model error checked
#   speculation_recheck  the CPU model error recalibrated on cores 8-15 while CUDA checks its own on other seeds
#   speculation_demo  `bench speculation --demo-workload --observed-arms` on CUDA: the demo's predictions against an
#                 A/B of the demo's own load, bare and observed engines (DEMO_SEEDS, DEMO_ROUNDS, TIMEOUT_S); the
#                 frames of seed K in spec_demo_frames.tgz (spec_demo_frames_sK/)
#   packed_prefill  benchmarks/packed_prefill.py on CUDA: a mixed step's forward, segments one call each or packed
#   observer_moe  benchmarks/observer_step.py on CUDA: tiny-moe engines without an observer (twice), with the
#                 probes, with the probes but no expert counts (OBSERVER_BATCHES, default "1 8")
#   demo_cuda     `infersight demo --device cuda`, its summary printed and its files kept
#   trust_h200    issue 26 on a fresh machine: the demo twice, `bench speculation` on the demo's seed, the energy
#                 split (TRUST_DEMOS, TRUST_SPEC_BATCHES, TRUST_SPEC_ARGS, TRUST_ENERGY_RUNS)
#   energy        benchmarks/energy_split_check.py: request classes alone, then mixed (NVML energy),
#                 the counter read every 1 s and every 0.1 s
#   energy_once   the same, the counter read every 1 s only (ENERGY_MODEL, ENERGY_INTERVAL_S, ENERGY_ARGS)
#   serving_profile  `bench runtime` decode at batch 48 (the engine's own rate), then `bench serving`'s
#                 no-agent arm at 48 clients with py-spy sampling the serve process mid-phase
#                 (py-spy carried in .whl/): where the serving loop's time goes
#   serving_packed  `bench serving`, no agent, 48 clients, with and without --packed-prefill (AB_PAIRS pairs)
#   serving_drift `bench serving` on CUDA, no agent, ten 30-s phases: throughput over time under constant
#                 load, with py-spy (GIL holders only) on serve early and late
#   serving_arms  `bench serving` on CUDA, llama-1b-shape, 48 clients: no agent (twice: the A/A floor),
#                 agent, agent + recorder, everything on; the recorder's first-window guess is
#                 RECORDER_INITIAL_COST (default 0.1 s: H200 windows measured 0.034 +- 0.011 s), as the
#                 agent's default 1.0 s takes no window in a short phase
#   serving_switchback  `bench serving --switchback-block-s` on CUDA, 48 clients: per arm one phase of PAIRS
#                 (default 40) pairs of BLOCK_S-second blocks (default 1), the agent stopped in one block of each
#                 pair; arms none_again (A/A), agent, agent_recorder, full, and engine_paused (serve's engine
#                 stopped for CALIBRATION (default 0.01) of its on blocks: the known answer)
#   serving_split `serve`'s engine in its own process against --engine-in-process, alternating fresh `serve`s
#                 (SPLIT_PAIRS, ONE_PHASE_S), the engine's batch-48 rate beside them; then, unless SKIP_ARMS, arms
#   serving_delay `bench serving`'s no-agent arm at 48 clients with --scheduler-delay-factor in DELAY_FACTORS
#                 (default "0 2 8") and --max-num-batched-tokens in BATCHED_TOKENS (default "512 2048");
#                 then, unless SKIP_ARMS, the A/A and agent arms (ARMS, ROUNDS, PHASE_S) at the fastest pair
#   serving_ab    `bench serving`'s no-agent arm at 48 clients, the tree in .before/ against this one, AB_PAIRS
#                 (default 2) interleaved pairs, SERVE_ARGS for both (e.g. "--max-num-batched-tokens=2048")
#   serving_switch `bench serving`'s no-agent arm at 48 clients with the interpreter's GIL switch interval
#                 (sys.setswitchinterval, through a sitecustomize) at each of SWITCH_INTERVALS (default
#                 "0.005 0.0005 0.005 0.0005"; 0.005 is CPython's default): does the engine thread wait
#                 for the GIL behind the event loop?
#   hf_decode     a Llama Hugging Face checkpoint of llama-1b-shape's dimensions (written by transformers)
#                 against the named config: decode steps at batch 1 and 32 (benchmarks/hf_decode_check.py)
#   expert_parallel_x4, expert_parallel_x8   benchmarks/ep_bench.py at W = 4 / 8, one rank per GPU,
#                 NCCL with NVLink multicast off (device kinds nvidia-h200-x4 / -x8);
#   expert_parallel_cpu   the same script at W = 4 on gloo (tiny-moe): checks that it runs
source "$(dirname "$0")/gpu_env.sh"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

speculation() {
  local bench="python3 -m infersight bench speculation --device cuda --json --rounds 3"
  taskset -c 8-15 python3 benchmarks/spec_calibration.py --seeds 101-108 --batches 4 8 --workers 8 --first-core 8 \
    --out "$OUT/spec_calibration_cpu.jsonl" > "$OUT/spec_calibration_cpu.txt" 2>&1 &
  local calib=$!
  stamp "CUDA-graph tests"
  timeout 240 taskset -c 0-7 python3 -m pytest -q -p no:cacheprovider -x tests/runtime/runner/test_cuda_graphs.py
  for b in 4 16; do
    stamp "bench speculation batch $b"
    timeout 240 taskset -c 0-7 $bench --batch $b --requests $((8 * b)) > "$OUT/spec_bench_b$b.json"
    tail -n 1 "$OUT/spec_bench_b$b.json"
  done
  stamp "demo on CUDA"
  timeout 300 taskset -c 0-7 python3 -m infersight demo --device cuda --out "$OUT/demo" > "$OUT/demo.txt" 2>&1
  tail -n 40 "$OUT/demo.txt"
  python3 - "$OUT/demo/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print("TTFT p50", s["ttft_seconds"]["p50"], "p99", s["ttft_seconds"]["p99"])
for t, v in sorted(s["spec"]["by_task"].items()):
    print(t, v["predicted_speedup"], v["speedup_interval"], v["basis"], v["samples"], v["parts_ms"])
EOF
  stamp "waiting for the CPU calibration"
  wait $calib
  tail -n 3 "$OUT/spec_calibration_cpu.txt"
  stamp "done"
}

ceilings() {
  export INFERSIGHT_CEILINGS="$OUT/ceilings.json"
  stamp "bench ceilings"
  timeout 120 python3 -m infersight bench ceilings --device cuda --dtype bfloat16 --json | tee "$OUT/ceilings_bf16.json"
  timeout 120 python3 -m infersight bench ceilings --device cuda --dtype float32 --json | tee "$OUT/ceilings_f32.json"
  stamp "analyze against the measured ceilings"
  python3 -m infersight analyze tests/kernels/data/kineto_llama-1b-decode-graphs-h200.json.gz | sed -n '/^roofline/,/^findings/p'
  stamp "bench runtime: roofline share against the measured copy bandwidth"
  timeout 300 python3 -m infersight bench runtime --model llama-1b-shape --device cuda --dtype bfloat16 --batch 1 \
    --prompt-len 512 --prefill-len 8192 --json | tee "$OUT/runtime_ceiling.json"
}

energy() {
  stamp "energy split, NVML every 1 s"
  timeout 400 python3 benchmarks/energy_split_check.py --device cuda --out "$OUT/energy_split.json"
  stamp "energy split, NVML every 0.1 s"
  timeout 400 python3 benchmarks/energy_split_check.py --device cuda --interval-s 0.1 --out "$OUT/energy_split_0.1.json"
}

observer_moe() {
  # What the probe observer costs a small MoE engine's decode step: tiny-moe engines alike but for their
  # observer, blocks in turn (benchmarks/observer_step.py), at OBSERVER_BATCHES (default "1 8").
  for b in ${OBSERVER_BATCHES:-1 8}; do
    stamp "observer_step.py, tiny-moe, batch $b"
    timeout 120 python3 benchmarks/observer_step.py --device cuda --batch "$b" --rounds 40 --block-steps 16 \
      > "$OUT/observer_step_b$b.txt" 2>&1
    grep -E "^(none|probes|no_counts)" "$OUT/observer_step_b$b.txt"
  done
}

packed_prefill() {
  # Issue 32 item 6: a mixed step's forward (llama-1b-shape bf16, 40 decodes beside the prefill chunks) with
  # its segments attended one call each, or packed: one masked SDPA call or one flash varlen call a layer
  # (benchmarks/packed_prefill.py).
  for cfg in ${PACKED_CONFIGS:-"2 128 0" "4 96 0" "8 48 0" "4 64 256"}; do
    set -- ${cfg//_/ }
    stamp "packed_prefill.py: $1 segments of $2 tokens after $3"
    timeout 120 python3 benchmarks/packed_prefill.py --model llama-1b-shape --device cuda --segments "$1" --seg-len "$2" \
      --prefix "$3" --decodes 40 --decode-context 300 --rounds 20 > "$OUT/packed_s$1_l$2_p$3.txt" 2>&1
    grep -E "^(loop|packed|varlen)" "$OUT/packed_s$1_l$2_p$3.txt"
  done
}

energy_once() {
  # ENERGY_MODEL / ENERGY_ARGS: another model shape or phase length (e.g. llama-8b-shape, whose dynamic
  # power dominates the GPU's static power, unlike llama-1b-shape's).
  stamp "energy split, NVML every ${ENERGY_INTERVAL_S:-1} s, ${ENERGY_MODEL:-llama-1b-shape}"
  timeout "${ENERGY_TIMEOUT_S:-330}" python3 benchmarks/energy_split_check.py --device cuda --model "${ENERGY_MODEL:-llama-1b-shape}" \
    --interval-s "${ENERGY_INTERVAL_S:-1}" ${ENERGY_ARGS:-} --out "$OUT/energy_split.json"
}

serving_profile() {
  [[ -n ${SKIP_RUNTIME:-} ]] || {
  stamp "engine decode rate, batch 48, async scheduling"
  timeout 120 python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape \
    --prompt-len 256 --batch 48 --decode-steps 100 --async-scheduling > "$OUT/runtime_b48.json"; tail -n 3 "$OUT/runtime_b48.json"; }
  stamp "bench serving, no agent, 48 clients, py-spy on serve"
  timeout 200 python3 -m infersight bench serving --model llama-1b-shape --device cuda --clients 48 --max-tokens 96 --phase-s 50 --warmup-s 10 \
    --rounds 1 --arms none --json > "$OUT/serving_none.json" 2> "$OUT/serving_none.err" &
  local bench=$! pid="" i
  for i in $(seq 1 90); do pid=$(pgrep -f "infersight serve" | head -n 1); [[ -n $pid ]] && break; sleep 1; done
  # serve's start (model build, graph capture) and the phase's warm-up, then 20 s of samples
  sleep 40
  PY_SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
  # --subprocesses: serve's engine runs in a child process (serve.engine_process) since 12-04
  timeout 40 "$PY_SPY" record --pid "$pid" --subprocesses --duration 15 --rate 100 --idle --threads --format raw \
    --output "$OUT/serve_pyspy.txt" --nonblocking > "$OUT/pyspy.log" 2>&1
  tail -n 3 "$OUT/pyspy.log"
  wait $bench
  tail -n 2 "$OUT/serving_none.json"
}

serving_drift() {
  stamp "bench serving, no agent, 10 phases of 30 s (throughput over time), py-spy --gil on serve early and late"
  timeout 420 python3 -m infersight bench serving --model llama-1b-shape --device cuda --clients 48 --max-tokens 96 \
    --phase-s 30 --warmup-s 2 --rounds 10 --arms none --json > "$OUT/serving_drift.json" 2> "$OUT/serving_drift.err" &
  local bench=$! pid="" i
  for i in $(seq 1 90); do pid=$(pgrep -f "infersight serve" | head -n 1); [[ -n $pid ]] && break; sleep 1; done
  PY_SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
  sleep 70
  timeout 40 "$PY_SPY" record --pid "$pid" --duration 20 --rate 200 --gil --format raw \
    --output "$OUT/serve_gil_early.txt" --nonblocking > "$OUT/pyspy_early.log" 2>&1
  sleep 200
  timeout 40 "$PY_SPY" record --pid "$pid" --duration 20 --rate 200 --gil --format raw \
    --output "$OUT/serve_gil_late.txt" --nonblocking > "$OUT/pyspy_late.log" 2>&1
  wait $bench
  grep "^round" "$OUT/serving_drift.err" | tail -n 10
}

serving_arms() {
  stamp "bench serving, five arms, 48 clients"
  timeout ${TIMEOUT_S:-330} python3 -m infersight bench serving --model llama-1b-shape --device cuda --clients 48 \
    --max-tokens 96 --phase-s ${PHASE_S:-15} --warmup-s 3 --rounds ${ROUNDS:-2} \
    --arms ${ARMS:-none,none_again,agent,agent_recorder,full} \
    --agent-arg=--recorder-initial-cost=${RECORDER_INITIAL_COST:-0.1} \
    > "$OUT/serving_arms.txt" 2>&1
  tail -n 25 "$OUT/serving_arms.txt"
}

serving_switchback() {
  stamp "bench serving, switchback, 48 clients"
  timeout ${TIMEOUT_S:-540} python3 -m infersight bench serving --model llama-1b-shape --device cuda --clients 48 \
    --max-tokens 96 --max-tokens-spread ${SPREAD:-0.5} --warmup-s 5 --rounds 1 --switchback-block-s ${BLOCK_S:-1} \
    --switchback-pairs ${PAIRS:-40} \
    --arms ${ARMS:-none,none_again,agent,agent_recorder,full} --calibration-pause ${CALIBRATION:-0.01} \
    --agent-arg=--recorder-initial-cost=${RECORDER_INITIAL_COST:-0.1} \
    > "$OUT/serving_switchback.txt" 2>&1
  tail -n 14 "$OUT/serving_switchback.txt" | cut -c1-600
}

# One `bench serving` phase, no agent, 48 clients (ONE_PHASE_S seconds, default 25): its JSON in
# $OUT/NAME.json, one line printed, "TOKENS tokens/s; TTFT p50 ...; serve cores ... (LABEL)", or
# "0 failed (LABEL): ..." with the log's last line. Further arguments go to `bench serving`.
serving_once() {
  local label=$1 name=$2
  shift 2
  timeout 150 python3 -m infersight bench serving --model llama-1b-shape --device cuda --clients 48 --max-tokens 96 \
    --phase-s ${ONE_PHASE_S:-25} --warmup-s 5 --rounds 1 --arms none --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  python3 -c "import json,sys; a=json.loads(open(sys.argv[1]).read().splitlines()[-1])['arms']['none']; \
print(round(a['tokens_per_s']), 'tokens/s; TTFT p50', round(a['ttft_p50_s']*1e3), 'ms; ITL p50/p99', \
round(a['itl_p50_s']*1e3, 1), round(a['itl_p99_s']*1e3, 1), 'ms; serve cores', round(a['serve_cores'], 2), '($label)')" \
    "$OUT/$name.json" 2>/dev/null || echo "0 failed ($label): $(tail -n 1 "$OUT/$name.err")"
}

serving_delay() {
  local f b line best="" best_tps=0
  [[ -n ${SKIP_RUNTIME:-} ]] || {
  stamp "engine decode rate, batch 48, async scheduling"
  timeout 120 python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape \
    --prompt-len 256 --batch 48 --decode-steps 100 --async-scheduling > "$OUT/runtime_b48.json"; tail -n 1 "$OUT/runtime_b48.json" | cut -c1-300; }
  for b in ${BATCHED_TOKENS:-512 2048}; do
    for f in ${DELAY_FACTORS:-0 2 8}; do
      stamp "bench serving, no agent, 48 clients, --scheduler-delay-factor $f --max-num-batched-tokens $b"
      line=$(serving_once "factor $f, batched $b" "serving_delay_f${f}_b$b" \
        --serve-arg=--scheduler-delay-factor=$f --serve-arg=--max-num-batched-tokens=$b)
      echo "$line"
      if (( ${line%% *} > best_tps )); then best_tps=${line%% *}; best="$f $b"; fi
    done
  done
  echo "fastest: factor/batched ${best} at $best_tps tokens/s"
  [[ -n ${SKIP_ARMS:-} || -z $best ]] && return 0
  set -- $best
  stamp "bench serving arms at factor $1, batched $2"
  timeout ${TIMEOUT_S:-330} python3 -m infersight bench serving --model llama-1b-shape --device cuda --clients 48 \
    --max-tokens 96 --phase-s ${PHASE_S:-20} --warmup-s 3 --rounds ${ROUNDS:-3} --arms ${ARMS:-none,none_again,agent} \
    --serve-arg=--scheduler-delay-factor=$1 --serve-arg=--max-num-batched-tokens=$2 > "$OUT/serving_delay_arms.txt" 2>&1
  tail -n 12 "$OUT/serving_delay_arms.txt" | cut -c1-400
}

serving_split() {
  # Issue 32 item 6: serve's engine in a process of its own (the default) against the engine on a thread of the
  # HTTP server's process (--engine-in-process), alternating, a fresh serve for each phase; the engine's own
  # batch-48 decode rate beside them; then the arms with the split serve (item 1).
  [[ -n ${SKIP_RUNTIME:-} ]] || {
  stamp "engine decode rate, batch 48, async scheduling"
  timeout 120 python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape \
    --prompt-len 256 --batch 48 --decode-steps 100 --async-scheduling > "$OUT/runtime_b48.json"; tail -n 3 "$OUT/runtime_b48.json"; }
  local i
  for i in $(seq 1 ${SPLIT_PAIRS:-2}); do
    stamp "bench serving, no agent, 48 clients, engine process, pair $i"
    serving_once "engine process" "split_$i"
    stamp "bench serving, no agent, 48 clients, engine in-process, pair $i"
    serving_once "in-process" "inproc_$i" --serve-arg=--engine-in-process
  done
  python3 - "$OUT" <<'EOF2'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/split_*.json")) + sorted(glob.glob(sys.argv[1] + "/inproc_*.json")):
    try:
        a = json.loads(open(f).read().splitlines()[-1])["arms"]["none"]
    except Exception as e:  # noqa: BLE001
        print(f, "unreadable", e); continue
    print(f.rsplit("/", 1)[1], "serve cores", round(a["serve_cores"], 2), "engine cores", round(a.get("engine_cores", float("nan")), 2))
EOF2
  [[ -n ${SKIP_ARMS:-} ]] || ARMS=${SPLIT_ARMS:-none,none_again,agent_recorder} ROUNDS=${SPLIT_ROUNDS:-3} PHASE_S=${SPLIT_PHASE_S:-15} serving_arms
}

serving_ab() {
  if [[ ! -d .before ]]; then echo "serving_ab needs a before tree in .before/ (carry it)"; return 2; fi
  local i side a args=()
  for a in ${SERVE_ARGS:-}; do args+=("--serve-arg=$a"); done
  for i in $(seq 1 ${AB_PAIRS:-2}); do
    for side in before after; do
      stamp "bench serving, no agent, 48 clients, $side, pair $i (${SERVE_ARGS:-})"
      ( if [[ $side == before ]]; then cd .before && export PYTHONPATH=/tmp/site:$PWD; fi
        serving_once "$side" "serving_ab_${side}_$i" "${args[@]}" )
    done
  done
}

serving_packed() {
  # Issue 32 item 6: `serve` with its prefill chunks packed into one attention call a layer, or not; pairs of
  # one-phase runs, the order alternating so a drift across the call falls on both sides.
  local i side
  for i in $(seq 1 ${AB_PAIRS:-3}); do
    for side in $( ((i % 2)) && echo "loop packed" || echo "packed loop"); do
      stamp "bench serving, no agent, 48 clients, prefill $side, pair $i"
      if [[ $side == packed ]]; then serving_once "$side" "serving_packed_${side}_$i" --serve-arg=--packed-prefill
      else serving_once "$side" "serving_packed_${side}_$i" --serve-arg=--no-packed-prefill; fi
    done
  done
}

serving_switch() {
  local sw dir n=0
  dir=$(mktemp -d)
  printf 'import os, sys\nif os.environ.get("SWITCH_S"):\n    sys.setswitchinterval(float(os.environ["SWITCH_S"]))\n' > "$dir/sitecustomize.py"
  for sw in ${SWITCH_INTERVALS:-0.005 0.0005 0.005 0.0005}; do
    stamp "bench serving, no agent, 48 clients, GIL switch interval $sw s"
    n=$((n + 1))
    SWITCH_S=$sw PYTHONPATH=$dir:${PYTHONPATH:-} serving_once "switch $sw s" "serving_switch_${n}_$sw"
  done
}

hf_decode() {
  stamp "Hugging Face checkpoint against the named config, decode batch 1 and 32"
  timeout 240 python3 benchmarks/hf_decode_check.py --device cuda | tee "$OUT/hf_decode.txt" | tail -n 1
}

speculation_check() {
  stamp "bench speculation on CUDA, seed 1 (not the calibration's), batch 4"
  timeout 150 python3 -m infersight bench speculation --device cuda --json --rounds 3 --batch 4 --requests 32 \
    --seed 1 --frames-out "$OUT/spec_frames_b4" > "$OUT/spec_bench_seed1_b4.json"
  tail -n 1 "$OUT/spec_bench_seed1_b4.json"
  stamp "bench speculation on CUDA, seed 1 (not the calibration's), batch 16"
  timeout 300 python3 -m infersight bench speculation --device cuda --json --rounds 3 --batch 16 --requests 128 \
    --seed 1 --frames-out "$OUT/spec_frames_b16" > "$OUT/spec_bench_seed1_b16.json"
  tail -n 1 "$OUT/spec_bench_seed1_b16.json"
}

speculation_recheck() {
  # After the plain mixed probes (spec_probe, spec_speedup's M(P, b)): the CPU model error recalibrated
  # on the host's cores 8-15 while the CUDA check runs on 0-7, at seeds the fix was not derived from.
  # SPEC_CPU_CALIB=0: the CUDA runs alone (checking spec_speedup.MODEL_ERROR_CUDA on other seeds).
  local calib=""
  if [ "${SPEC_CPU_CALIB:-1}" != 0 ]; then
    timeout 520 taskset -c 8-15 python3 benchmarks/spec_calibration.py --seeds 101-108 --batches 4 8 --workers 8 \
      --first-core 8 --out "$OUT/spec_calibration_cpu.jsonl" > "$OUT/spec_calibration_cpu.txt" 2>&1 &
    calib=$!
  fi
  for run in ${SPEC_RUNS:-"4 4 32" "4 16 128" "5 16 128"}; do
    set -- ${run//_/ }
    stamp "bench speculation on CUDA, seed $1, batch $2"
    timeout 170 taskset -c 0-7 python3 -m infersight bench speculation --device cuda --json --rounds 3 --batch "$2" \
      --requests "$3" --seed "$1" --frames-out "$OUT/spec_frames_s$1_b$2" > "$OUT/spec_s$1_b$2.json"
    python3 - "$OUT/spec_s$1_b$2.json" <<'EOF2'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("mixed probes", d.get("mixed_probe_steps"), "probe share", d.get("probe_share"), "inside", d.get("tasks_inside"))
for t in ("chat", "code", "creative", "json"):
    print(t, d.get(t + ".measured_speedup"), d.get(t + ".predicted_speedup"), d.get(t + ".predicted_interval"), d.get(t + ".inside"))
EOF2
  done
  # the frames, one file back (which part of the prediction is high: step prices or the load)
  (cd "$OUT" && tar -czf spec_recheck_frames.tgz spec_frames_s* && rm -rf spec_frames_s*)
  if [ -n "$calib" ]; then
    stamp "waiting for the CPU calibration"
    wait $calib
    tail -n 12 "$OUT/spec_calibration_cpu.txt"
  fi
}

speculation_demo() {
  # Issue 26 item 1: the demo's own predictions against an A/B of the demo's own load (all tasks mixed, its
  # arrivals, its KV pool and probe rate), on CUDA; DEMO_SEEDS (default "0 1"), DEMO_ROUNDS (default 2).
  for seed in ${DEMO_SEEDS:-0 1}; do
    stamp "bench speculation --demo-workload on CUDA, seed $seed"
    timeout "${TIMEOUT_S:-240}" python3 -m infersight bench speculation --demo-workload --device cuda --json \
      --rounds "${DEMO_ROUNDS:-2}" --seed "$seed" --observed-arms --frames-out "$OUT/spec_demo_frames_s$seed" \
      > "$OUT/spec_demo_s$seed.json"
    python3 - "$OUT/spec_demo_s$seed.json" <<'EOF2'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("inside", d.get("tasks_inside"), "of", d.get("tasks"), "(observed arms:", d.get("tasks_inside_observed"), ") contradict",
      d.get("tasks_contradict"), "wall", d.get("wall_s"))
for t in ("chat", "code", "creative", "json"):
    print(t, d.get(t + ".measured_rounds"), d.get(t + ".measured_rounds_observed"), d.get(t + ".predicted_speedup"),
          d.get(t + ".open_arrivals_speedup"), d.get(t + ".predicted_interval"), d.get(t + ".inside"), d.get(t + ".advice"))
EOF2
    # The plain price beside what it prices: steady async probe steps (engine clock) against the plain arms'
    # decode steps (client clock), median ms by batch, the four commonest batches.
    python3 - "$OUT/spec_demo_frames_s$seed" <<'EOF2'
import sys
import pandas as pd
d = sys.argv[1]
t, steps = pd.read_parquet(f"{d}/step_timing.parquet"), pd.read_parquet(f"{d}/steps.parquet")
p = t[t.spec_probe & (t.prefill_tokens == 0) & (t.graph_captures == 0) & t.launched_ahead & t.launched_next]
rows = {"steady_probe": ((p.end_ns - p.start_ns) / 1e6).groupby(p.decode_requests).median(),
        "probe_forward": (p.target_ns / 1e6).groupby(p.decode_requests).median()}
for arm in ("plain", "plain_observed"):
    a = steps[(steps.arm == arm) & (steps.kind == "decode")]
    rows[arm] = (a.client_ns / 1e6).groupby(a.batch).median()
top = steps[(steps.arm == "plain") & (steps.kind == "decode")].batch.value_counts().index[:4]
print(pd.DataFrame(rows).reindex(sorted(top)).round(3).to_string())
EOF2
  done
  # one file back, not three a seed: a device call returns a limited number of files
  (cd "$OUT" && tar -czf spec_demo_frames.tgz spec_demo_frames_s* && rm -rf spec_demo_frames_s*)
}

demo_cuda() {
  demo_events demo_cuda  # its summary printed, its files kept
}

demo_events() {
  # One `infersight demo --device cuda` run into /tmp/$1, its summary and the agent's event files kept in $OUT.
  stamp "demo on CUDA: $1"
  timeout 300 python3 -m infersight demo --device cuda --out "/tmp/$1" > "$OUT/$1.txt" 2>&1
  tail -n 12 "$OUT/$1.txt"
  mkdir -p "$OUT/$1" && cp "/tmp/$1/summary.json" "$OUT/$1/" 2>/dev/null
  (cd "/tmp/$1/events" && tar -czf "$OUT/$1/events.tgz" .)  # one file: the device tool brings back few
  python3 - "/tmp/$1" <<'EOF2'
import json, sys
import pandas as pd
s = json.load(open(sys.argv[1] + "/summary.json"))
print("TTFT p50", s["ttft_seconds"]["p50"], "p99", s["ttft_seconds"]["p99"])
for t, v in sorted(s["spec"]["by_task"].items()):
    print(t, v["predicted_speedup"], v["speedup_interval"], v["basis"], v["samples"], v["parts_ms"])
t = pd.read_parquet(sys.argv[1] + "/events/step_timing.parquet")
t["ms"] = (t["end_ns"] - t["start_ns"]) / 1e6
t["kind"] = (t["prefill_tokens"] > 0).map({True: "mixed", False: "decode"}) + t["spec_probe"].map({True: " plain", False: " spec"})
cols = [c for c in ("graph_captures", "profiled") if c in t]
print(t.groupby(["kind", *cols])["ms"].describe(percentiles=[0.5]).round(2).to_string())
EOF2
}

trust_h200() {
  # Issue 26 on a fresh machine: the demo's first and second runs (events kept), bench speculation on the
  # demo's seed at the demo's batch sizes (frames kept), and the energy split twice (llama-8b-shape).
  for d in ${TRUST_DEMOS:-demo_first demo_second}; do demo_events "$d"; done
  stamp "the demo engine's CUDA graphs"
  timeout 120 python3 -c "
from infersight.demo import DemoConfig, demo_engine_config
from infersight.runtime import Engine
e = Engine(demo_engine_config(DemoConfig(), 'cuda'))
print('dtype', e.config.dtype, 'graph_blocker', e.target.graph_blocker, 'captured', e.capture_decode_graphs(),
      'disabled', getattr(e.target.graphs, 'disabled', None))"
  for b in ${TRUST_SPEC_BATCHES:-4 8}; do
    stamp "bench speculation on CUDA, seed 0, batch $b"
    timeout 170 python3 -m infersight bench speculation --device cuda --json --rounds 3 --batch "$b" \
      --requests $((8 * b)) --seed 0 ${TRUST_SPEC_ARGS:-} > "$OUT/spec_s0_b$b.json"
    tail -n 1 "$OUT/spec_s0_b$b.json" | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
for t in ('chat', 'code', 'creative', 'json'):
    print(t, d.get(t + '.measured_speedup'), d.get(t + '.predicted_speedup'), d.get(t + '.predicted_interval'), d.get(t + '.inside'))"
  done
  for k in ${TRUST_ENERGY_RUNS:-1 2}; do
    ENERGY_MODEL=llama-8b-shape ENERGY_ARGS="--phase-s 30" energy_once
    mv "$OUT/energy_split.json" "$OUT/energy_split_$k.json"; mv "$OUT/energy_split_run" "$OUT/energy_split_run_$k"
  done
}

gpu_tests() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  stamp "CUDA tests"
  timeout 240 python3 -m pytest -rfE -p no:cacheprovider tests/runtime/engine/test_async_scheduling.py \
    tests/runtime/runner/test_cuda_graphs.py tests/runtime/model/test_fused_forward.py tests/runtime/engine/test_batch_sampling.py \
    tests/runtime/runner/test_profiled_decode.py tests/runtime/model/test_moe_experts.py tests/runtime/model/test_triton_decode.py \
    tests/runtime/engine/test_tokens_told.py tests/runtime/model/test_packed_segments.py 2>&1 | tail -n 4
  stamp "correctness against the reference paths"
  timeout 120 python3 benchmarks/gpu_check.py
}

decode() {
  local bench="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape --prompt-len 512"
  stamp "decode steps, async, with the eager comparison and the HF anchor"
  timeout 150 $bench --batch 32 --decode-steps 130 --async-scheduling --compare-eager --hf-anchor eager
  timeout 150 $bench --batch 1 --decode-steps 130 --async-scheduling --hf-anchor all
}

probe_cost() {
  local probe="python3 benchmarks/probe_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 --context 512 --block-steps 16 --rounds 40 --rounds-per-life 8"
  stamp "probe cost, synchronous"
  timeout 120 $probe > "$OUT/probe_sync.json"; tail -n 8 "$OUT/probe_sync.json" | head -n 7
  stamp "probe cost, async scheduling"
  timeout 120 $probe --async-scheduling > "$OUT/probe_async.json"; tail -n 8 "$OUT/probe_async.json" | head -n 7
  stamp "one recorder window's cost by blocks against the recorder's own measure"
  timeout 150 python3 benchmarks/window_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
    --context 512 --windows 16 --block-steps 64 > "$OUT/window_cost.json"; tail -n 5 "$OUT/window_cost.json"
}

observer_cost() {
  if [[ ! -d .before ]]; then echo "observer_cost needs a before tree in .before/ (carry it)"; return 2; fi
  stamp "agent ingest, one poll per fresh process on one core, before / after / after again"
  timeout 150 python3 benchmarks/ingest_ab.py --against .before --pairs 5 --core 3
  stamp "observer CPU time per batch-32 step, before / after / after again"
  timeout 200 taskset -c 5 python3 benchmarks/observer_cost.py --against .before --rounds 3 --steps 2000
}

captures() {
  local m=llama-1b-shape
  stamp "capture cost, torch.profiler"
  timeout 180 python3 benchmarks/capture_check.py --model $m --tool torch
  stamp "capture cost, cudaProfilerStart/Stop"
  timeout 120 python3 benchmarks/capture_check.py --model $m --tool cuda-profiler --before 2 --after 2
  stamp "what a torch.profiler window leaves behind (one process per line)"
  for v in none cpu cuda; do timeout 60 python3 benchmarks/profiler_residue.py --variant $v 2>&1 | grep -v Warning; done
}

expert_parallel() {  # expert_parallel W: mixtral-shape, 8 layers then all 32 (each rank builds only its experts)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=1
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  for layers in 8 0; do
    stamp "W=$1 mixtral-shape layers=$layers (0: all 32)"
    timeout 270 python3 -m torch.distributed.run --standalone --nproc-per-node "$1" benchmarks/ep_bench.py \
      --model mixtral-shape --dtype bfloat16 --batch 64 --prompt-len 128 --warmup 4 --steps 32 --out "$OUT" --layers $layers
  done
}
expert_parallel_x4() { expert_parallel 4; }
expert_parallel_x8() { expert_parallel 8; }
expert_parallel_cpu() {
  local port
  port=$("${PY:-python3}" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  stamp "W=4 gloo tiny-moe"
  OMP_NUM_THREADS=1 timeout 300 "${PY:-python3}" -m torch.distributed.run --nnodes 1 --nproc-per-node 4 --master-addr 127.0.0.1 \
    --master-port "$port" benchmarks/ep_bench.py --device cpu --model tiny-moe --layers 0 --dtype float32 \
    --batch 8 --prompt-len 16 --warmup 2 --steps 12 --out "$OUT"
  echo "rc=$?"
}

SUITES="trust_h200 gpu_tests decode probe_cost observer_cost observer_moe packed_prefill captures speculation speculation_check speculation_recheck speculation_demo demo_cuda ceilings energy energy_once serving_profile serving_drift serving_arms serving_switchback serving_split serving_delay serving_ab serving_packed serving_switch hf_decode expert_parallel_x4 expert_parallel_x8 expert_parallel_cpu"
for suite in "$@"; do
  if [[ " $SUITES " == *" $suite "* ]]; then
    "$suite" 2>&1 | tee "$OUT/$suite.log"
  else
    echo "unknown suite: $suite (one of: $SUITES)" >&2; exit 2
  fi
done
