"""`infersight serve`."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infersight.runtime.config import EngineConfig


def run(args: argparse.Namespace) -> int:
    import logging

    import torch

    from infersight.commands.agent import parse_listen
    from infersight.probes.config import ProbeConfig
    from infersight.serve.config import ServeConfig
    from infersight.serve.runner import serve
    from infersight.serve.sidecar import AgentOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s infersight-serve %(levelname)s %(message)s")
    host, port = parse_listen(args.listen)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    config = ServeConfig(host=host, port=port, model_name=args.served_model_name or args.model,
                         max_body_bytes=args.max_body_bytes, max_header_bytes=args.max_header_bytes,
                         max_pending=args.max_pending, export_content=args.export_content,
                         header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                         max_connections=args.max_connections, engine_in_process=args.engine_in_process)
    engine_config = serve_engine_config(args, device)
    agent = None
    if args.with_agent:
        parse_listen(args.agent_listen)  # a bad address is a usage error here, not a dead subprocess
        agent = AgentOptions(listen=args.agent_listen, otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol,
                             trace_sample_ratio=args.trace_sample_ratio, export_content=args.export_content,
                             otlp_metrics=args.otlp_metrics)
    elif args.otlp_endpoint is not None:
        raise ValueError("--otlp-endpoint needs --with-agent (spans are built by the agent)")
    serve(config, engine_config, ProbeConfig(ring_name=args.ring, nvtx=args.nvtx, engine_name=args.engine_name), agent)
    return 0


def serve_engine_config(args: argparse.Namespace, device: str) -> "EngineConfig":
    """The engine `serve` runs for these arguments on `device` (cpu or cuda), its CUDA defaults applied."""
    from infersight.runtime.config import EngineConfig, resolve_dtype

    cuda = device.startswith("cuda")
    return EngineConfig(model=args.model, speculative_model=args.speculative_model, device=device,
                        dtype=resolve_dtype(args.dtype, device, args.model), seed=args.seed,
                        num_kv_blocks=args.num_kv_blocks, max_model_len=args.max_model_len,
                        enforce_eager=args.enforce_eager,
                        packed_prefill=args.packed_prefill if args.packed_prefill is not None else cuda,
                        async_scheduling=args.async_scheduling, scheduler_delay_factor=args.scheduler_delay_factor,
                        max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens if args.max_num_batched_tokens is not None
                        else CUDA_BATCHED_TOKENS if cuda else CPU_BATCHED_TOKENS,
                        spec_probe_every=args.spec_probe_every if args.speculative_model else 0)


#: --max-num-batched-tokens' defaults. On CUDA a prompt of a few hundred tokens then prefills in one step
#: beside the decodes instead of in chunks over several eager steps: at 48 clients on the H200 (llama-1b-shape,
#: BENCHMARKS.md, 2026-12-04) 9.8 k client tokens/s against 5.9 k at 512. vLLM's server also uses 2048 or more
#: on a GPU. The CPU keeps the engine's 512 (no graphs there to get back to).
CUDA_BATCHED_TOKENS, CPU_BATCHED_TOKENS = 2048, 512


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server around the engine, probes on")
    p.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000)")
    p.add_argument("--model", default="tiny-moe",
                   help="a model config name, or a Hugging Face model directory (config.json, safetensors, "
                        "tokenizer.json) (default tiny-moe)")
    p.add_argument("--served-model-name", help="the name clients send as `model` (default: --model)")
    p.add_argument("--speculative-model", help="draft model config name (speculative decoding)")
    p.add_argument("--spec-probe-every", type=int, default=16, metavar="N",
                   help="with --speculative-model: run one in N decode steps at each batch size without "
                        "speculation, so the agent measures the speedup (default 16; 0: never)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                   help="weights and activations (vLLM's flag; auto: float32 on the CPU; on CUDA a checkpoint's own "
                        "dtype, bfloat16 for a named config)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-kv-blocks", type=int, help="device KV blocks (default: sized from the model)")
    p.add_argument("--max-model-len", type=int, metavar="N",
                   help="longest prompt + output served (default: the model's); longer prompts get a 400")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    p.add_argument("--packed-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="a step's prefill chunks (and verify windows) attend in one call per layer, not one call per "
                        "chunk: flash's variable-length kernel on CUDA (16-bit), SDPA under one mask elsewhere "
                        "(default: on for CUDA, where it served 1.46-1.57x the tokens/s at 48 clients on an H200, measured; "
                        "off on the CPU, where it gained nothing)")
    p.add_argument("--engine-in-process", action="store_true",
                   help="run the engine on a thread of the HTTP server's process (default: a process of its own, "
                        "as vLLM V1's engine core, so neither waits for the other's interpreter lock)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="launch each steady decode step before reading the one before (vLLM's flag; "
                        "default: on for CUDA, off on the CPU)")
    p.add_argument("--max-num-seqs", type=int, default=64, metavar="N",
                   help="requests batched in one step at most (vLLM's flag; default 64)")
    p.add_argument("--max-num-batched-tokens", type=int, metavar="N",
                   help="tokens one step feeds at most, prefill chunks and decodes together (vLLM's flag; default "
                        f"{CUDA_BATCHED_TOKENS} on CUDA, {CPU_BATCHED_TOKENS} on the CPU)")
    p.add_argument("--scheduler-delay-factor", type=float, default=0.0, metavar="F",
                   help="hold new requests until the oldest has waited F times the last prefill step, so "
                        "prefills come in fewer steps and the steps between stay decode-only (vLLM's flag; "
                        "default 0: admit at every step)")
    p.add_argument("--max-pending", type=int, default=256, help="requests in flight before 429 (default 256)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body limit (413 beyond)")
    p.add_argument("--max-header-bytes", type=int, default=16 << 10, help="request header limit")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                   help="seconds from a request's first byte to its last header byte (408 and closed beyond)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="seconds to receive a request body once its headers are in (408 beyond)")
    p.add_argument("--max-connections", type=int, default=512, metavar="N",
                   help="connections held at once; one more is answered 503 and closed, and counted (default 512)")
    p.add_argument("--ring", help="probe ring name (default infersight-<pid>)")
    p.add_argument("--engine-name", metavar="NAME",
                   help="this engine's name, announced on its ring: the `engine` label of an agent that reads "
                        "several rings (at most 32 printable ASCII characters; default: the ring's name)")
    p.add_argument("--nvtx", action="store_true", help="also emit NVTX ranges")
    p.add_argument("--export-content", action="store_true",
                   help="pass prompt and completion text to the agent for spans (off: text never leaves the server)")
    agent = p.add_argument_group("the sidecar agent")
    agent.add_argument("--with-agent", action="store_true", help="start `infersight agent` on the server's ring")
    agent.add_argument("--agent-listen", default="127.0.0.1:9464", help="the agent's HOST:PORT")
    agent.add_argument("--otlp-endpoint", nargs="?", const="", metavar="URL",
                       help="the agent exports spans here (http/protobuf: http://HOST:4318; without URL: "
                            "OTEL_EXPORTER_OTLP_* variables)")
    agent.add_argument("--otlp-protocol", choices=("http/protobuf", "grpc"))
    agent.add_argument("--trace-sample-ratio", type=float, default=1.0,
                       help="share of requests traced; slow and failed ones always are (default 1.0)")
    agent.add_argument("--otlp-metrics", action="store_true", help="also export gen_ai.server.* histograms")
    p.set_defaults(func=run)
