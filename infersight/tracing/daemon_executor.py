"""A thread pool whose workers never hold the process open: the OTLP/gRPC receiver's handlers run here.

concurrent.futures.ThreadPoolExecutor joins its workers at interpreter exit, so one handler stuck in
its work (a sink that waits on a lock, a client that keeps the call open) keeps the agent alive
after it was told to stop, for as long as the handler takes. gRPC stops the calls themselves
(server.stop(grace)); what is left of a handler is abandoned with the process, as any daemon
thread is. grpc.server needs only submit() of its executor.
"""
from __future__ import annotations

import queue
import threading
from concurrent import futures
from typing import Any, Callable

_STOP = None


class DaemonThreadExecutor(futures.Executor):
    """max_workers daemon threads, started at once, taking calls in the order submitted."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "daemon-worker") -> None:  # noqa: D107
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._shutdown = False
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, name=f"{thread_name_prefix}_{i}", daemon=True)
                         for i in range(max_workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future:  # type: ignore[override]
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            future: futures.Future = futures.Future()
            self._calls.put((future, fn, args, kwargs))
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; the workers end after the queued ones (wait: join them)."""
        with self._lock:
            self._shutdown = True
        if cancel_futures:
            while True:
                try:
                    item = self._calls.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[0].cancel()
        for _ in self._threads:
            self._calls.put(_STOP)
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        while (item := self._calls.get()) is not _STOP:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 -- delivered to the future, as ThreadPoolExecutor does
                future.set_exception(exc)
