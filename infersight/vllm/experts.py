"""Expert load for MoE models served by vLLM: a general plugin (entry-point group
``vllm.general_plugins``) that counts routed expert ids per layer on the device, in each worker.

vLLM loads general plugins in every process it starts (API server, engine core, workers) and calls
``register`` once in each. Nothing of vLLM is patched; the plugin uses public hooks only:

1. torch's global module-registration hook sees every submodule assignment while a model is built.
   It notes vLLM's MoE runners (``MoERunner`` whose router is a ``BaseRouter``) and the modules that
   contain them; the outermost one (e.g. ``MixtralForCausalLM``) gets a forward pre-hook. A model
   without MoE layers gets no hooks (only the registration hook, which runs while modules are
   built, never in a step).
2. At that root's first forward (before Dynamo traces the model), each router gets a capture
   callback through ``BaseRouter.set_capture_fn``: vLLM's own callback for the *logical* expert
   ids it routed to (the one ``--enable-return-routed-experts`` uses), called right after top-k and
   before any EPLB mapping. The counts are thus vLLM's selection itself, whatever the routing rule
   (softmax top-k, grouped, biased, custom), not a re-implementation of it. The callback adds into
   a [layers, experts] int64 device tensor (ExpertCounter): no host sync; on vLLM's CPU path
   (Dynamo, fullgraph) it is traced into the compiled graph.
3. Forwards before the first real step are vLLM's profiling, warm-up and CUDA-graph capture runs
   (``_dummy_run``: no attention metadata, or a batch that is all padding). At the first real step
   the pre-hook zeroes what they counted, starts the publisher thread (ExpertPublisher: every
   INFERSIGHT_EXPERT_PUBLISH_INTERVAL seconds, default 0.2, the new counts as MOE probe records into
   this worker's ring ``infersight-vllm-worker-<pid>``, created at the first forward, which
   ``agent --discover`` finds) and removes itself: from then on the plugin runs no Python in a step. The records' ``step_id`` is
   the publish window (1, 2, ...), not vLLM's step (vLLM does not expose one to the worker). The ring
   announces the engine's name (an ENGINE record, at creation and every GPU_RECORD_EVERY_S from the
   publisher thread): the API server's name (vllm.engine_name), so an agent labels the worker's
   expert counts with the engine they belong to, not with the worker.

Compile cache: vLLM reuses compiled graphs from disk under a key that does not see our callback, so a
graph compiled with the plugin off would load with it on (counting nothing) and the other way round.
The plugin therefore sets ``"infersight_expert_counts"`` in the worker's
``vllm_config.additional_config``, the field vLLM hashes into that key for out-of-tree code.

Off switch: ``INFERSIGHT_EXPERT_COUNTS=0`` (``=hooks``: all but the counting callback, for
benchmarks). ``INFERSIGHT_EXPERT_TIMING=PATH``: the publisher rewrites PATH (JSON) about once a second
with the plugin's own cost; with ``INFERSIGHT_EXPERT_TIME_FORWARDS=1`` as well, hooks stay on every
forward to time it (benchmarks: ExpertCountsConfig). Errors are logged once and turn the plugin off for the process; nothing is raised into vLLM.
Limits: with data parallelism, the dummy batches idle ranks run during serving are counted;
monolithic MoE kernels (which skip the router) are not counted.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import time
import weakref
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Mapping

import torch

from infersight.probes.records import (
    GPU_RECORD_EVERY_S, RecordKind, engine_name_bytes, record_registry, record_struct,
)
from infersight.probes.ring import RingProducer
from infersight.vllm.engine_name import vllm_engine_name
from infersight.vllm.expert_counting import CostTimes, ExpertCounter, ExpertPublisher

# A child of vLLM's "vllm" logger, so lines land in vLLM's log with its format.
log = logging.getLogger("vllm.infersight.experts")
_RUNNER_MODULE = "vllm.model_executor.layers.fused_moe.runner.moe_runner"
_ROUTER_MODULE = "vllm.model_executor.layers.fused_moe.router.base_router"
CACHE_KEY = "infersight_expert_counts"
TIMING_WRITE_INTERVAL_NS = 1_000_000_000


@dataclass
class ExpertCountsConfig:
    """enabled: INFERSIGHT_EXPERT_COUNTS (default on; "0", "false", "off", "no" turn it off).
    count: False with INFERSIGHT_EXPERT_COUNTS=hooks (benchmarks): everything but the counting
    callback, so an A/B against it isolates what the counting inside the graph costs.
    publish_interval_s: INFERSIGHT_EXPERT_PUBLISH_INTERVAL. ring_capacity: slots of the worker's ring
    (INFERSIGHT_EXPERT_RING_CAPACITY). timing_path: INFERSIGHT_EXPERT_TIMING, a JSON file the
    publisher rewrites about once a second with the plugin's own cost (None: not written).
    time_forwards: INFERSIGHT_EXPERT_TIME_FORWARDS=1 (benchmarks; needs timing_path) keeps a pre- and
    a post-forward hook on every step to time the forward, and times the counting where it is Python."""

    enabled: bool = True
    count: bool = True
    publish_interval_s: float = 0.2
    ring_capacity: int = 1 << 14
    timing_path: str | None = None
    time_forwards: bool = False

    def __post_init__(self) -> None:
        if self.ring_capacity < 2:
            raise ValueError(f"ring_capacity must be >= 2, got {self.ring_capacity}")
        if self.time_forwards and not self.timing_path:
            raise ValueError("timing forwards needs a timing file (INFERSIGHT_EXPERT_TIMING)")
        if not 0.001 <= self.publish_interval_s <= 60:
            raise ValueError(f"publish interval must be between 0.001 and 60 s, got {self.publish_interval_s}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ExpertCountsConfig":
        switch = env.get("INFERSIGHT_EXPERT_COUNTS", "1").strip().lower()
        return cls(enabled=switch not in ("0", "false", "off", "no"), count=switch != "hooks",
                   publish_interval_s=float(env.get("INFERSIGHT_EXPERT_PUBLISH_INTERVAL", "0.2")),
                   ring_capacity=int(env.get("INFERSIGHT_EXPERT_RING_CAPACITY", str(1 << 14))),
                   timing_path=env.get("INFERSIGHT_EXPERT_TIMING") or None,
                   time_forwards=env.get("INFERSIGHT_EXPERT_TIME_FORWARDS", "0") == "1")


def worker_ring_name(pid: int) -> str:
    return f"infersight-vllm-worker-{pid}"


def current_dp_rank() -> int:
    """The data-parallel rank in vLLM's current config: read while the model is built (vLLM sets the
    config then, not around every forward); 0 where none is set."""
    try:
        from vllm.config import get_current_vllm_config

        parallel = getattr(get_current_vllm_config(), "parallel_config", None)
        return int(getattr(parallel, "data_parallel_rank", 0) or 0)
    except Exception:  # no current config (vLLM asserts): rank 0, never an error in the worker
        return 0


class EngineAnnouncer:
    """Writes the ENGINE record of a ring: now, then again once GPU_RECORD_EVERY_S have passed at each
    ``maybe`` (the caller is the ring's one producer at that time)."""

    def __init__(self, ring: RingProducer, name: str) -> None:
        self.ring, self.name = ring, name
        self._pack = record_struct(RecordKind.ENGINE).pack
        self._due_ns = 0
        self.maybe()

    def maybe(self) -> None:
        now = time.monotonic_ns()
        if now >= self._due_ns:
            self.ring.write(RecordKind.ENGINE, self._pack(now, engine_name_bytes(self.name)))
            self._due_ns = now + int(GPU_RECORD_EVERY_S * 1e9)


def register() -> None:
    """The ``vllm.general_plugins`` entry point. The plugin object lives on in torch's hook table
    (the registration hook is its bound method), so no module global is needed."""
    try:
        config = ExpertCountsConfig.from_env(os.environ)
        if config.enabled:
            ExpertLoadPlugin(config).install()
    except Exception as exc:  # never break vLLM's startup
        log.warning("infersight expert counts disabled: %s", exc)


def _moe_runner_router(module: torch.nn.Module) -> Any | None:
    """The router of a vLLM MoE runner whose routing calls a capture callback, else None. Looked up
    in sys.modules: until vLLM has imported its MoE runner, no module can be one."""
    runner_mod, router_mod = sys.modules.get(_RUNNER_MODULE), sys.modules.get(_ROUTER_MODULE)
    if runner_mod is None or router_mod is None or not isinstance(module, runner_mod.MoERunner):
        return None
    router = getattr(module, "router", None)
    return router if isinstance(router, router_mod.BaseRouter) else None


def _is_dummy_run() -> bool:
    """vLLM's real steps run with attention metadata and at least one real token; its profiling,
    warm-up and capture runs (GPUModelRunner._dummy_run) without metadata or all padding. Reading
    the padding mask syncs a GPU: this runs only until the first real step."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return True
    ctx = get_forward_context()
    padding = getattr(ctx, "is_padding", None)
    return ctx.attn_metadata is None or (padding is not None and bool(padding.all()))


class ExpertLoadPlugin:
    """Finds the MoE layers of the model a worker builds, counts their routing, publishes the counts."""

    def __init__(self, config: ExpertCountsConfig) -> None:
        self.config = config
        self._has_moe: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # runners and their ancestors
        self._root_hooks: dict[int, list[Any]] = {}  # id(candidate root) -> hook handles
        self._registration = None
        self._root: torch.nn.Module | None = None
        self._counter: ExpertCounter | None = None
        self._ring: RingProducer | None = None
        self._publisher: ExpertPublisher | None = None
        self._announcer: EngineAnnouncer | None = None
        self._dp_rank = 0  # the worker's data-parallel rank, read while the model is built
        self._failed = False
        self._timed = config.time_forwards
        self.times = CostTimes()
        self._forward_start = (0, 0)
        self._timing_written_ns = 0

    def install(self) -> None:
        self._registration = torch.nn.modules.module.register_module_module_registration_hook(self._on_register)

    # -- while the model is built ------------------------------------------------------------
    def _on_register(self, parent: torch.nn.Module, name: str, child: torch.nn.Module | None) -> None:
        try:
            if child is None or (child not in self._has_moe and _moe_runner_router(child) is None):
                return
            if not self._has_moe:
                self._mark_compile_cache("count" if self.config.count else "hooks")
                self._dp_rank = current_dp_rank()
            self._has_moe.add(child)
            self._has_moe.add(parent)
            self._drop_hooks(child)
            if id(parent) not in self._root_hooks:  # the outermost module with MoE layers keeps the hook
                self._root_hooks[id(parent)] = [parent.register_forward_pre_hook(self._before_forward)]
        except Exception as exc:
            self._fail("while the model was built", exc)

    def _drop_hooks(self, module_or_id: torch.nn.Module | int) -> None:
        key = module_or_id if isinstance(module_or_id, int) else id(module_or_id)
        for handle in self._root_hooks.pop(key, ()):
            handle.remove()

    @staticmethod
    def _mark_compile_cache(mode: str) -> None:
        from vllm.config import get_current_vllm_config

        extra = get_current_vllm_config().additional_config
        if isinstance(extra, dict):
            extra[CACHE_KEY] = mode
        else:
            log.warning("infersight: additional_config is not a dict; a cached compiled graph may lack expert counting "
                        "(set VLLM_DISABLE_COMPILE_CACHE=1 if counts stay at zero)")

    # -- the root's first forward: bind the routers, before Dynamo traces the model --------------
    def _bind(self, root: torch.nn.Module) -> None:
        self._root = root
        if self._registration is not None:
            self._registration.remove()
            self._registration = None
        for other in [k for k in self._root_hooks if k != id(root)]:  # e.g. a drafter: not counted
            self._drop_hooks(other)
        runners = [(m, r) for m in root.modules() if (r := _moe_runner_router(m)) is not None]
        if not runners:
            raise RuntimeError("no MoE router found under the model")
        runners.sort(key=lambda mr: int(mr[0].layer_id))
        n_experts = max(int(r.global_num_experts) for _, r in runners)
        self._counter = counter = ExpertCounter([int(m.layer_id) for m, _ in runners], n_experts,
                                                next(root.parameters()).device)
        count = self._timed_count if self._timed else counter.count
        for row, (_, router) in enumerate(runners if self.config.count else []):
            mine = partial(count, row)
            # vLLM's own capturer (--enable-return-routed-experts), if bound, keeps working.
            router.set_capture_fn(mine if router.capture_fn is None else partial(_both, router.capture_fn, mine))
        if self._timed:
            self._root_hooks[id(root)].append(root.register_forward_hook(self._after_forward))
        name = worker_ring_name(os.getpid())
        self._ring = RingProducer.create(name, self.config.ring_capacity, None, record_registry())
        atexit.register(self.close)
        self._announcer = EngineAnnouncer(self._ring, vllm_engine_name(os.environ, self._dp_rank))
        log.info("infersight: counting routed experts of %d MoE layers x %d experts into ring %s (engine %r) "
                 "every %.3g s", len(runners), n_experts, name, self._announcer.name, self.config.publish_interval_s)

    def _start_publishing(self) -> None:
        """At the first real step: forget what dummy runs counted, start the publisher thread."""
        assert self._counter is not None and self._ring is not None
        self._counter.counts.zero_()
        self._publisher = ExpertPublisher(self._counter, self._ring, self.config.publish_interval_s,
                                          self._after_publish, partial(self._fail, "in the publisher thread")).start()

    # -- the root's forwards -----------------------------------------------------------------
    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self._failed:
            return
        t0 = CostTimes.now() if self._timed else None
        try:
            if self._root is None:
                self._bind(module)
            if self._publisher is None and not _is_dummy_run():
                self._start_publishing()
                if not self._timed:  # nothing left to do in a step
                    self._drop_hooks(module)
        except Exception as exc:
            self._fail("before a forward", exc)
        if t0 is not None:
            self._forward_start = CostTimes.now()
            self.times.add("pre_hook", t0, self._forward_start)

    def _after_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """Only with time_forwards: the forward's own time (real steps only)."""
        if self._publisher is not None:
            self.times.add("forward", self._forward_start, CostTimes.now())

    def _timed_count(self, row: int, topk_ids: torch.Tensor) -> None:
        """counter.count, timed where it runs as Python (eager); while Dynamo traces, is_compiling()
        is True and the graph gets the bare count."""
        assert self._counter is not None
        if torch.compiler.is_compiling():
            self._counter.count(row, topk_ids)
            return
        t0 = CostTimes.now()
        self._counter.count(row, topk_ids)
        self.times.add("count", t0, CostTimes.now())

    def _after_publish(self) -> None:
        """In the publisher thread (the ring's one producer): the engine's name again when due, the
        timing file when asked for."""
        if self._announcer is not None:
            self._announcer.maybe()
        if self.config.timing_path:
            self._maybe_write_timing()

    def _maybe_write_timing(self) -> None:
        now = time.perf_counter_ns()
        if now - self._timing_written_ns > TIMING_WRITE_INTERVAL_NS:
            self._timing_written_ns = now
            self._write_timing()

    def _write_timing(self) -> None:
        """Atomically (write, rename); called from the publisher thread, and at close."""
        path = Path(self.config.timing_path or "")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        publisher = self._publisher.times.as_dict() if self._publisher else {}
        tmp.write_text(json.dumps({"pid": os.getpid(), **self.times.as_dict(), **publisher}))
        tmp.replace(path)

    def _fail(self, where: str, exc: BaseException) -> None:
        """Log once and stop: no more hooks (a callback already in a compiled graph keeps counting)."""
        if self._failed:
            return
        self._failed = True
        log.warning("infersight expert counts stopped (%s): %s: %s", where, type(exc).__name__, exc)
        try:
            for key in list(self._root_hooks):
                self._drop_hooks(key)
            if self._registration is not None:
                self._registration.remove()
                self._registration = None
        except Exception:  # nothing more to do
            pass

    def close(self) -> None:
        """Publish what is left and remove the ring (atexit)."""
        try:
            if self._publisher is not None:
                self._publisher.stop()
                if self.config.timing_path:
                    self._write_timing()
                self._publisher = None
            if self._ring is not None:
                self._ring.close()
                self._ring.unlink()
                self._ring = None
        except Exception as exc:
            log.warning("infersight expert counts: closing the ring failed: %s", exc)


def _both(first: Any, second: Any, topk_ids: torch.Tensor) -> None:
    first(topk_ids)
    second(topk_ids)
