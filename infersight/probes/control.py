"""The control block: a few bytes of shared memory through which the agent asks the engine for
a capture, and the engine answers. The engine reads one counter per step; that is all it pays.

    0  magic "ISCTRL\\0\\0" | version u32 | pad
   16  request_seq u64   (agent writes: ask for capture number request_seq)
   24  steps u32 | tool u8 | decode u8 | pad  (agent writes, before request_seq)
   32  ack_seq u64       (engine writes: the last request it took)
   40  state u8 | pad                     (engine writes: idle, running, done, failed)
   48  path (256 bytes, NUL-padded UTF-8) (engine writes: where the capture went)
  304  first_step u64    (engine writes: the engine step id the window began with)
  512  the run-time policy region (probes.policy_block: per-task speculation, max_num_seqs)
"""
from __future__ import annotations

import enum
import os
import struct
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

from infersight.probes.policy_block import BLOCK_SIZE as POLICY_BLOCK_SIZE

MAGIC = b"ISCTRL\0\0"
VERSION = 1
SIZE = 512
_OLD_TRACKER = os.name == "posix" and sys.version_info < (3, 13)


class CaptureTool(enum.IntEnum):
    TORCH = 1           # torch.profiler (CPU + CUDA activities, shapes) -> Kineto trace
    CUDA_PROFILER = 2   # cudaProfilerStart/Stop, for `nsys profile --capture-range=cudaProfilerApi`
    TORCH_KERNELS = 3   # torch.profiler, activity only: no shapes, no stacks (flight-recorder windows)


class CaptureDecode(enum.IntEnum):
    """How decode steps run while a torch.profiler window records: a choice carried with each request.

    EAGER: launched kernel by kernel, inside the per-layer ranges (record_function), so every kernel
    is attributed to its layer and op; on an engine with CUDA graphs these are not the steps it runs
    outside the window (7-9x slower on the H200). GRAPHS: the CUDA graphs already captured replay as
    they do outside the window: kernel activity and the engine's real step time, no per-layer ranges
    (the graph's kernels show under cudaGraphLaunch). A step that would need a new capture still runs
    eagerly (no graph is captured while the profiler records). A cuda-profiler capture never stops
    graph replays (nsys traces graph kernels itself): the field only concerns torch.profiler windows."""

    EAGER = 1
    GRAPHS = 2


def default_decode(tool: CaptureTool) -> CaptureDecode:
    """The decode mode a request of `tool` gets when it names none: a full torch capture wants
    per-layer ranges (EAGER); a kernel-activity window (the flight recorder's) wants the real steps."""
    return CaptureDecode.GRAPHS if tool is CaptureTool.TORCH_KERNELS else CaptureDecode.EAGER


class CaptureState(enum.IntEnum):
    IDLE = 0
    RUNNING = 1
    DONE = 2
    FAILED = 3


def control_name(ring_name: str) -> str:
    return f"{ring_name}-ctl"


class ControlBlock:
    """Both ends use this class: the engine creates (create=True), the agent attaches."""

    def __init__(self, name: str, create: bool) -> None:
        if create:
            # The run-time policy region follows the capture fields (probes.policy_block, BLOCK_SIZE bytes
            # in all); an agent of an older version reads the first SIZE bytes only.
            self.shm = SharedMemory(name=name, create=True, size=POLICY_BLOCK_SIZE)
            self.shm.buf[:POLICY_BLOCK_SIZE] = bytes(POLICY_BLOCK_SIZE)
            struct.pack_into("<8sI", self.shm.buf, 0, MAGIC, VERSION)
        else:
            self.shm = SharedMemory(name=name, **({} if _OLD_TRACKER else {"track": False}))
            if _OLD_TRACKER:  # the agent never owns the block: keep its tracker from unlinking it
                resource_tracker.unregister("/" + self.shm.name, "shared_memory")
            magic, version = struct.unpack_from("<8sI", self.shm.buf, 0)
            if magic != MAGIC or version != VERSION or self.shm.size < SIZE:
                self.shm.close()
                raise ValueError(f"{name!r} is not an infersight control block of version {VERSION}")
        self.owner = create
        self._words = self.shm.buf[16:48].cast("Q")  # request_seq, (steps|tool), ack_seq, (state)

    # -- agent side ---------------------------------------------------------------------------
    def request(self, steps: int, tool: CaptureTool, decode: CaptureDecode | None = None) -> int:
        """Ask for a capture of `steps` steps; decode None: the tool's default (default_decode)."""
        decode = default_decode(tool) if decode is None else decode
        struct.pack_into("<IBB", self.shm.buf, 24, steps, int(tool), int(decode))
        seq = self._words[0] + 1
        self._words[0] = seq  # written last: the engine sees steps and tool before the new seq
        return int(seq)

    # -- engine side --------------------------------------------------------------------------
    @property
    def request_seq(self) -> int:
        return int(self._words[0])

    @property
    def ack_seq(self) -> int:
        return int(self._words[2])

    def take(self) -> tuple[int, int, CaptureTool]:
        """(seq, steps, tool) of the pending request, acknowledged."""
        steps, tool = struct.unpack_from("<IB", self.shm.buf, 24)
        seq = self.request_seq
        self._words[2] = seq
        self.set_state(CaptureState.RUNNING, "")
        return seq, int(steps), CaptureTool(tool)

    @property
    def decode(self) -> CaptureDecode:
        """The decode mode of the pending (or last taken) request; the tool's default if it names none."""
        tool, raw = struct.unpack_from("<BB", self.shm.buf, 28)
        if raw in (CaptureDecode.EAGER, CaptureDecode.GRAPHS):
            return CaptureDecode(raw)
        return default_decode(CaptureTool(tool)) if tool in CaptureTool._value2member_map_ else CaptureDecode.EAGER

    def set_first_step(self, step_id: int) -> None:
        struct.pack_into("<Q", self.shm.buf, 304, step_id)

    @property
    def first_step(self) -> int:
        """Captured step k (0-based, as a Kineto trace numbers them) is engine step first_step + k."""
        return int(struct.unpack_from("<Q", self.shm.buf, 304)[0])

    def set_state(self, state: CaptureState, path: str) -> None:
        raw = path.encode()[:255]
        self.shm.buf[48:48 + 256] = raw + bytes(256 - len(raw))
        self.shm.buf[40] = int(state)

    # -- both ---------------------------------------------------------------------------------
    @property
    def state(self) -> CaptureState:
        return CaptureState(self.shm.buf[40])

    @property
    def path(self) -> str:
        return bytes(self.shm.buf[48:48 + 256]).rstrip(b"\0").decode(errors="replace")

    def close(self) -> None:
        self._words.release()
        self.shm.close()
        if self.owner:
            if _OLD_TRACKER:
                resource_tracker.register("/" + self.shm.name, "shared_memory")  # see RingProducer.unlink
            self.shm.unlink()
