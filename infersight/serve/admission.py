"""How many requests a server holds at once: a bound checked at the door (429 past it), released when
each request ends. Any thread may reserve or release; the handlers reserve, whoever finishes releases."""
from __future__ import annotations

import threading


class Admission:
    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return self._pending

    def try_reserve(self) -> bool:
        """One more request, or False when max_pending are in flight."""
        with self._lock:
            if self._pending >= self.max_pending:
                return False
            self._pending += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._pending -= 1
