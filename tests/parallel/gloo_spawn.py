"""Run a function on W local CPU processes joined by gloo, and collect what each returns.

For the tests; on GPUs use torchrun
(infersight.commands.ep_launch). Each process gets the environment
torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT)
and one intra-op thread, so W processes do not oversubscribe a small machine.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import traceback
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from infersight.runtime.parallel.group import free_port, init_from_env

T = TypeVar("T")


class SpawnError(RuntimeError):
    """A rank raised, died, or did not answer in time."""


def _worker(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...],
            results: "mp.Queue[tuple[int, bool, Any]]") -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        group = init_from_env("cpu")
        try:
            # Pickled here, by value: through the queue torch would share tensors by file
            # descriptor, which dies with this process before the parent reads it.
            results.put((rank, True, pickle.dumps(fn(group, *args))))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
        results.put((rank, False, traceback.format_exc()))


def spawn_local(world: int, fn: Callable[..., T], *args: Any, timeout_s: float = 120.0) -> list[T]:
    """fn(group: EPGroup, *args) on `world` processes; returns their results in rank order.

    fn, args and the results must be picklable (fn a module-level function). Raises SpawnError with the first
    failing rank's traceback, or when a rank gives no result within timeout_s."""
    ctx = mp.get_context("spawn")
    results: "mp.Queue[tuple[int, bool, Any]]" = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        while len(got) < world:
            try:
                rank, ok, value = results.get(timeout=timeout_s)
            except queue.Empty:
                raise SpawnError(f"ranks {sorted(set(range(world)) - set(got))} gave no result "
                                 f"within {timeout_s:.0f} s") from None
            if not ok:
                raise SpawnError(f"rank {rank} failed:\n{value}")
            got[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return [got[r] for r in range(world)]

