"""Engine-side capture: wrap the next N steps in torch.profiler or cudaProfilerStart/Stop.

Outside a capture window the engine pays one integer comparison per step (is there a new
request in the control block?). The trace is written when the window closes, on the engine's
thread: a capture is asked for, so its export cost is accepted; everything else stays free.

Beside each capture goes its shapes file, `capture-PID-SEQ.shapes.json`: the model's shape and,
for every step in the window, its phase and each sequence's (request id, tokens fed, KV length
after the step). With it a capture's FLOPs and bytes can be modelled step by step (read by
infersight.kernels.readers.shapes). A torch capture's control-block path is the trace
(`capture-PID-SEQ.json.gz`; a flight-recorder window's is plain `.json`, read once and deleted); a
cuda-profiler capture has no trace of ours (nsys or ncu writes it), so its path is the shapes file.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch

from infersight.probes.control import CaptureDecode, CaptureState, CaptureTool, ControlBlock
from infersight.probes.heap_trim import TRIM_ABOVE_BYTES, resident_bytes, trim_heap

if TYPE_CHECKING:
    from infersight.runtime.model.model_config import ModelConfig
    from infersight.runtime.stats import StepStats

log = logging.getLogger("infersight.probes")
SHAPES_FORMAT = "infersight-capture-shapes/1"


def release_results(profiler: "torch.profiler.profile | None") -> None:
    """Free a stopped profile's recorded events now. The profile object is a reference cycle (its action
    map holds its own bound methods), so dropping it frees nothing until a full collection, which a
    long-lived engine rarely runs; the events it holds (Kineto's results) were then kept window after
    window: VmRSS +53.9 MB over 100 CPU windows, +0.1 MB with this, as with a gc.collect() of 104 ms after
    each (benchmarks/profiler_garbage.py; pytorch issue 193348). Its `profiler` attribute holds them, and
    nothing else refers to that."""
    if profiler is not None and getattr(profiler, "profiler", None) is not None:
        profiler.profiler = None


def private_dir(path: Path) -> None:
    """Create ``path`` 0700 if missing; refuse (OSError) a directory another user owns or can
    write to, where our traces could be swapped or linked elsewhere."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(f"capture directory {path} is not a directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"capture directory {path} is owned by uid {st.st_uid} with mode "
                      f"{stat.S_IMODE(st.st_mode):04o}: it must be this user's and not writable by others")


def open_private(path: Path) -> BinaryIO:
    """``path`` opened for writing, readable by this user only (0600), never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # an older file of the same name keeps its mode otherwise
    return os.fdopen(fd, "wb")


class StepCapture:
    def __init__(self, control: ControlBlock, out_dir: str | Path) -> None:
        self.control = control
        self.out_dir = Path(out_dir)
        self._seen = control.request_seq  # requests made before we started are not ours
        self._profiler: torch.profiler.profile | None = None
        self._tool: CaptureTool | None = None
        self._decode = CaptureDecode.EAGER
        self._left = 0
        self._seq = 0
        self._model: dict[str, Any] | None = None
        self._dtype_bytes = 0
        self._first_step = 0
        self._steps: list[dict[str, Any]] = []
        self._resident_floor = 0  # the resident set before the first window, then after the last trim
        self.trims = 0  # windows after which the heap was trimmed (probes.heap_trim)

    def on_model(self, model: ModelConfig, dtype_bytes: int) -> None:
        self._model, self._dtype_bytes = dataclasses.asdict(model), dtype_bytes

    @property
    def decode_graphs(self) -> bool:
        """True while a window whose request chose CaptureDecode.GRAPHS records: decode steps may
        replay their CUDA graphs under the profiler (the engine reads it through its observer's
        decode_graphs_while_profiling). False outside windows and for EAGER ones (per-layer ranges)."""
        return self._left > 0 and self._decode is CaptureDecode.GRAPHS

    def on_step_begin(self, step_id: int) -> None:
        if self._left == 0 and self.control.request_seq != self._seen:
            self._start(step_id)

    def on_step_end(self, stats: StepStats) -> None:
        if self._left:
            if stats.launched_ahead and stats.step_id == self._first_step:
                # Async scheduling launched it before its begin started the window: its kernels are
                # not in the trace, so it is not one of the window's N steps (under torch.profiler the
                # engine launches nothing ahead: the next ones run synchronously). first_step stays:
                # the trace numbers its step ranges from this step, whose read-back range it holds.
                return
            if stats.batch:
                self._steps.append({"step_id": stats.step_id, "phase": stats.phase,
                                    "seqs": [[rid, n, ctx] for (rid, n), ctx in zip(stats.batch, stats.context_lens)]})
            self._left -= 1
            if self._left == 0:
                self._stop()

    def close(self) -> None:
        """End a capture window that is still open (the engine stops before N steps): write what
        was captured. A profiler left running would record every later op of the process."""
        if self._left:
            self._left = 0
            self._stop()

    def warm_up(self) -> float:
        """Start and stop the profiler once, outside any window, recording nothing; returns the
        seconds it took. Kineto (and CUPTI on a GPU) initialise at the process's first profiler start:
        1.14 s on the 2-core CPU machine, against 0.3 ms for each later start (BENCHMARKS.md). Without
        this the first window pays it on a request's step, and the recorder counts it in that
        window's cost (an H200 `serve` phase of 20 s read 4.6% against a 0.5% budget). Call before
        serving; a no-op while a window records."""
        if self._left:
            return 0.0
        started = time.perf_counter()
        try:
            profiler = torch.profiler.profile(activities=self._activities())
            profiler.start()
            profiler.stop()
            release_results(profiler)
        except Exception as exc:  # noqa: BLE001 -- a warm-up must never take the engine down
            log.warning("the profiler warm-up failed (the first capture pays its start-up): %s", exc)
        return time.perf_counter() - started

    @staticmethod
    def _activities() -> list[torch.profiler.ProfilerActivity]:
        # Without TEARDOWN_CUPTI Kineto leaves CUPTI attached after the window, and a launch-bound
        # engine keeps paying its callbacks (measured: 1.2x slower steps for good; see
        # BENCHMARKS.md). Read when the profiler stops; a value set by the user wins.
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return activities

    def _start(self, step_id: int) -> None:
        self.control.set_first_step(step_id)
        self._first_step = step_id
        self._seq, steps, self._tool = self.control.take()
        self._decode = self.control.decode
        self._seen = self._seq
        self._left = max(1, steps)
        self._steps = []
        if not self._resident_floor:
            self._resident_floor = resident_bytes()
        try:
            if self._tool in (CaptureTool.TORCH, CaptureTool.TORCH_KERNELS):
                activities = self._activities()
                # A flight-recorder window (TORCH_KERNELS) records activity only: input shapes
                # cost a copy of every op's sizes, and the recorder needs time per op, not shapes.
                self._profiler = torch.profiler.profile(activities=activities,
                                                        record_shapes=self._tool is CaptureTool.TORCH)
                self._profiler.start()
            else:
                torch.cuda.profiler.start()
        except Exception as exc:  # a capture must never take the engine down
            log.error("capture %d could not start: %s", self._seq, exc)
            self._left = 0
            self.control.set_state(CaptureState.FAILED, str(exc))

    def _write_shapes(self, path: Path) -> None:
        doc = {"format": SHAPES_FORMAT, "model": self._model, "dtype_bytes": self._dtype_bytes,
               "first_step": self._first_step, "steps": self._steps}
        with open_private(path) as f:
            f.write(json.dumps(doc, separators=(",", ":")).encode())

    def _export_plain(self, path: Path) -> None:
        """A flight-recorder window's trace, as plain JSON: the agent reads it once and deletes it, so
        compressing it would only spend the engine's step (gzip at level 1 took twice as long as the
        JSON export itself on the CPU; BENCHMARKS.md). Written under a temporary name, made 0600 and
        renamed into place, so the agent never sees half a file."""
        part = path.with_name(path.name + ".part")
        self._profiler.export_chrome_trace(str(part))  # Kineto makes the file itself, with the umask's mode
        os.chmod(part, 0o600)  # in a 0700 directory (private_dir): no one else could open it meanwhile
        os.replace(part, path)

    def _stop(self) -> None:
        stem = self.out_dir / f"capture-{os.getpid()}-{self._seq}"
        shapes = stem.with_name(stem.name + ".shapes.json")
        profiled = self._tool in (CaptureTool.TORCH, CaptureTool.TORCH_KERNELS) and self._profiler is not None
        try:
            # The profiler stops first, whatever happens to the files: one left running would record
            # every later op of the engine (and crashes the interpreter at exit).
            if profiled:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self._profiler.stop()
            else:
                torch.cuda.profiler.stop()
        except Exception as exc:
            log.error("capture %d could not stop its profiler: %s", self._seq, exc)
            self.control.set_state(CaptureState.FAILED, str(exc))
            self._profiler, self._steps = None, []
            return
        try:
            private_dir(self.out_dir)
            if self._model is not None:
                self._write_shapes(shapes)
            if profiled and self._tool is CaptureTool.TORCH_KERNELS:
                path = stem.with_name(stem.name + ".json")
                self._export_plain(path)
                self.control.set_state(CaptureState.DONE, str(path))
            elif profiled:
                path = stem.with_name(stem.name + ".json.gz")
                with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
                    raw = tmp.name
                self._profiler.export_chrome_trace(raw)
                with open(raw, "rb") as src, open_private(path) as out, \
                        gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1) as dst:  # in the engine's step: fast
                    shutil.copyfileobj(src, dst)
                os.unlink(raw)
                self.control.set_state(CaptureState.DONE, str(path))
            else:
                self.control.set_state(CaptureState.DONE, str(shapes) if self._model is not None else "")
        except Exception as exc:
            log.error("capture %d could not be written: %s", self._seq, exc)
            self.control.set_state(CaptureState.FAILED, str(exc))
        finally:
            release_results(self._profiler)
            self._profiler = None
            self._steps = []
            # Measured from the last trim, not from this window's start: beside `serve` each window left
            # 5-12 MB of free heap behind (glibc's arena grew around the engine's live chunks), and no one
            # window crossed a per-window threshold (probes.heap_trim).
            resident = resident_bytes()
            if resident - self._resident_floor > TRIM_ABOVE_BYTES:
                t0 = time.perf_counter()
                if trim_heap():
                    self.trims += 1
                    self._resident_floor = resident_bytes()
                    log.info("heap trimmed after capture %d: %.1f MB returned in %.1f ms", self._seq,
                             (resident - self._resident_floor) / 2**20, (time.perf_counter() - t0) * 1e3)
