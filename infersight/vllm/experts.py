"""Expert load for MoE models served by vLLM: a general plugin (entry-point group
``vllm.general_plugins``) that counts routed expert ids per layer on the device, in each worker.

vLLM loads general plugins in every process it starts (API server, engine core, workers) and calls
``register`` once in each. Nothing of vLLM is patched; the plugin uses three public hooks:

1. torch's global module-registration hook sees every submodule assignment while a model is built.
   It notes vLLM's MoE runners (``MoERunner``, whose router is a ``BaseRouter``) and the modules
   that contain them; the outermost one (e.g. ``MixtralForCausalLM``) gets a forward pre-hook and a
   forward hook. A model without MoE layers gets no hooks at all (only the registration hook, which
   runs while modules are built, never in a step).
2. At that root's first forward (before Dynamo traces the model), each runner's router gets a
   capture callback through ``BaseRouter.set_capture_fn``: vLLM's own callback for the *logical*
   expert ids it routed to (the one ``--enable-return-routed-experts`` uses), called right after
   top-k and before any EPLB mapping. The counts are therefore vLLM's selection itself, whatever
   the routing rule (softmax top-k, grouped, biased, custom), not a re-implementation of it. The
   callback is an ``index_add_`` into a [layers, experts] int64 device tensor: no host sync, and
   on vLLM's CPU path (Dynamo, fullgraph) it is traced into the compiled graph.
3. The root's forward hook is the step boundary: this step's counts are copied non-blocking to
   pinned memory and zeroed; the previous step's copy (complete by now) is written as MOE probe
   records to this worker's ring ``infersight-vllm-worker-<pid>`` (``agent --discover`` finds it).
   Forwards without attention metadata are vLLM's dummy/profiling runs (``_dummy_run``): their
   counts are saved before and restored after, so they never count.

Compile cache: vLLM reuses compiled graphs from disk across restarts under a key that does not see
our callback, so a graph compiled with the plugin off would load with it on (counting nothing) and
the other way round. The plugin therefore adds ``"infersight_expert_counts"`` to the worker's
``vllm_config.additional_config``, the config field vLLM hashes into that key for out-of-tree code.

Off switch: ``INFERSIGHT_EXPERT_COUNTS=0`` (``=hooks``: the hooks without the counting, for
benchmarks). ``INFERSIGHT_EXPERT_TIMING=PATH``: the plugin rewrites PATH (JSON, about once a second)
with its own cost (HookTimes). Errors are logged once and turn the plugin off for the process;
nothing is raised into vLLM. Limits: under FULL CUDA graphs (GPU decode steps) the root's hooks do
not run on replay, so counts of such steps are published with the next eager step (totals stay
exact); monolithic MoE kernels (which skip the router) are not counted.
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
from typing import Any, Callable, Mapping

import torch

from infersight.probes.records import RecordKind, record_registry
from infersight.probes.ring import RingProducer
from infersight.vllm.expert_counting import ExpertCounter, HookTimes, StepCopies

# A child of vLLM's "vllm" logger, so lines land in vLLM's log with its format.
log = logging.getLogger("vllm.infersight.experts")
_RUNNER_MODULE = "vllm.model_executor.layers.fused_moe.runner.moe_runner"
_ROUTER_MODULE = "vllm.model_executor.layers.fused_moe.router.base_router"
CACHE_KEY = "infersight_expert_counts"
TIMING_WRITE_INTERVAL_NS = 1_000_000_000
_NO_TIME = (0, 0)


@dataclass
class ExpertCountsConfig:
    """enabled: INFERSIGHT_EXPERT_COUNTS (default on; "0", "false", "off" turn it off).
    count: False with INFERSIGHT_EXPERT_COUNTS=hooks, for benchmarks: every hook and ring write but
    no counting callback, so an A/B against it isolates what the counting inside the graph costs.
    ring_capacity: slots of the worker's ring (INFERSIGHT_EXPERT_RING_CAPACITY). timing_path: where
    to write the plugin's own cost (INFERSIGHT_EXPERT_TIMING; None: not measured)."""

    enabled: bool = True
    count: bool = True
    ring_capacity: int = 1 << 14
    timing_path: str | None = None

    def __post_init__(self) -> None:
        if self.ring_capacity < 2:
            raise ValueError(f"ring_capacity must be >= 2, got {self.ring_capacity}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ExpertCountsConfig":
        switch = env.get("INFERSIGHT_EXPERT_COUNTS", "1").strip().lower()
        return cls(enabled=switch not in ("0", "false", "off", "no"), count=switch != "hooks",
                   ring_capacity=int(env.get("INFERSIGHT_EXPERT_RING_CAPACITY", str(1 << 14))),
                   timing_path=env.get("INFERSIGHT_EXPERT_TIMING") or None)


def worker_ring_name(pid: int) -> str:
    return f"infersight-vllm-worker-{pid}"


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


class ExpertLoadPlugin:
    """Finds the MoE layers of the model a worker builds, counts their routing, publishes per step."""

    def __init__(self, config: ExpertCountsConfig) -> None:
        self.config = config
        self._has_moe: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # runners and their ancestors
        self._root_hooks: dict[int, tuple[Any, Any]] = {}  # id(candidate root) -> hook handles
        self._registration = None
        self._root: torch.nn.Module | None = None
        self._counter: ExpertCounter | None = None
        self._copies: StepCopies | None = None
        self._ring: RingProducer | None = None
        self._step_id = 0
        self._dummy = False
        self._failed = False
        self._timed = config.timing_path is not None
        self._pre_hook: tuple[tuple[int, int], tuple[int, int]] | None = None
        self._is_dummy_run: Callable[[], bool] = lambda: True  # set at bind, from vLLM's forward context
        self.times = HookTimes()
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
            self._has_moe.add(child)
            self._has_moe.add(parent)
            self._drop_root_hooks(child)
            if id(parent) not in self._root_hooks:  # the outermost module with MoE layers keeps them
                self._root_hooks[id(parent)] = (parent.register_forward_pre_hook(self._before_forward),
                                                parent.register_forward_hook(self._after_forward))
        except Exception as exc:
            self._fail("while the model was built", exc)

    def _drop_root_hooks(self, module: torch.nn.Module) -> None:
        for handle in self._root_hooks.pop(id(module), ()):
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

    # -- the first forward: bind the routers, before Dynamo traces the model ---------------------
    def _bind(self, root: torch.nn.Module) -> None:
        self._root = root
        if self._registration is not None:
            self._registration.remove()
            self._registration = None
        for other in [k for k in self._root_hooks if k != id(root)]:  # e.g. a drafter: not counted
            for handle in self._root_hooks.pop(other):
                handle.remove()
        runners = [(m, r) for m in root.modules() if (r := _moe_runner_router(m)) is not None]
        if not runners:
            raise RuntimeError("no MoE router found under the model")
        runners.sort(key=lambda mr: mr[0].layer_id)
        n_experts = max(int(r.global_num_experts) for _, r in runners)
        device = next(root.parameters()).device
        self._counter = counter = ExpertCounter([int(m.layer_id) for m, _ in runners], n_experts, device)
        self._copies = StepCopies(counter)
        count = self._timed_count if self._timed else counter.count
        for row, (_, router) in enumerate(runners if self.config.count else []):
            if router.capture_fn is not None:  # vLLM's own capturer (--enable-return-routed-experts) keeps working
                router.set_capture_fn(partial(_both, router.capture_fn, partial(count, row)))
            else:
                router.set_capture_fn(partial(count, row))
        name = worker_ring_name(os.getpid())
        self._ring = RingProducer.create(name, self.config.ring_capacity, None, record_registry())
        from vllm.forward_context import get_forward_context, is_forward_context_available

        # vLLM's real steps run with attention metadata; its dummy and profiling runs
        # (GPUModelRunner._dummy_run, also the CPU warm-up) without it, unless capturing FULL CUDA graphs.
        self._is_dummy_run = lambda: not is_forward_context_available() or get_forward_context().attn_metadata is None
        atexit.register(self.close)
        log.info("infersight: counting routed experts of %d MoE layers x %d experts into ring %s",
                 len(runners), n_experts, name)

    def _timed_count(self, row: int, topk_ids: torch.Tensor) -> None:
        """counter.count with its time measured where it runs as Python (eager); while Dynamo traces,
        is_compiling() is True and the graph gets the bare count."""
        assert self._counter is not None
        if torch.compiler.is_compiling():
            self._counter.count(row, topk_ids)
            return
        t0 = HookTimes.now()
        self._counter.count(row, topk_ids)
        self.times.add("count", t0, HookTimes.now())
        self.times.count_calls += 1

    # -- every forward of the root: the step boundary ------------------------------------------
    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self._failed:
            return
        t0 = HookTimes.now() if self._timed else _NO_TIME
        try:
            if self._root is None:
                self._bind(module)
            if module is not self._root or self._counter is None or self._capturing():
                return
            self._dummy = self._is_dummy_run()
            if self._dummy:
                self._counter.save()
        except Exception as exc:
            self._fail("before a forward", exc)
        self._pre_hook = (t0, HookTimes.now()) if self._timed else None

    def _after_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._failed or module is not self._root or self._counter is None:
            return
        t0 = HookTimes.now() if self._timed else _NO_TIME
        try:
            if self._capturing():
                return
            if self._dummy:
                self._counter.restore()
                return
            self._step_id += 1
            records = self._copies.publish(self._step_id) if self._copies else None
            if records is not None and self._ring is not None:
                self._ring.write_many(RecordKind.MOE, records)
            if self._timed and self._pre_hook is not None:
                self._account(t0, HookTimes.now())
        except Exception as exc:
            self._fail("after a forward", exc)

    def _account(self, post_start: tuple[int, int], post_end: tuple[int, int]) -> None:
        assert self._pre_hook is not None
        pre_start, pre_end = self._pre_hook
        self.times.steps += 1
        self.times.add("boundary", pre_start, pre_end)
        self.times.add("boundary", post_start, post_end)
        self.times.add("forward", pre_end, post_start)
        if post_end[0] - self._timing_written_ns > TIMING_WRITE_INTERVAL_NS:
            self._write_timing(post_end[0])

    def _capturing(self) -> bool:
        """A CUDA graph capture records device work without running it: the hooks stay out of it."""
        return self._counter is not None and self._counter.counts.is_cuda and torch.cuda.is_current_stream_capturing()

    def _write_timing(self, now_ns: int) -> None:
        self._timing_written_ns = now_ns
        path = Path(self.config.timing_path or "")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), **self.times.as_dict()}))
        tmp.replace(path)

    def _fail(self, where: str, exc: BaseException) -> None:
        self._failed = True
        log.warning("infersight expert counts stopped (%s): %s: %s", where, type(exc).__name__, exc)

    def close(self) -> None:
        """Write the copy still in flight, then remove the ring (atexit)."""
        try:
            records = self._copies.flush() if self._copies is not None else None
            if records is not None and self._ring is not None:
                self._ring.write_many(RecordKind.MOE, records)
            if self._timed and self.times.steps:
                self._write_timing(time.perf_counter_ns())
            if self._ring is not None:
                self._ring.close()
                self._ring.unlink()
                self._ring = None
        except Exception as exc:
            log.warning("infersight expert counts: closing the ring failed: %s", exc)


def _both(first: Any, second: Any, topk_ids: torch.Tensor) -> None:
    first(topk_ids)
    second(topk_ids)

