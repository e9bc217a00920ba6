"""A clock for the worker's tests (:class:`worker.clock.Clock`) that moves only when the test moves it."""

from __future__ import annotations

import threading
from collections import Counter

LOOK_AGAIN_S = 0.005  # real seconds between looks at a waited-for event (Event has no way to wake a Condition)


class FakeClock:
    """Time stands still until :meth:`advance`; :meth:`wait` returns when its event is set or the clock passed
    its timeout. :meth:`waits_in` counts the waits each thread began, so a test sees a thread come round to waiting."""

    def __init__(self, start_s: float = 1000.0, epoch_s: float = 1_800_000_000.0):
        self._now = start_s
        self._epoch_offset = epoch_s - start_s
        self._moved = threading.Condition()
        self._waits: Counter[str] = Counter()

    def monotonic(self) -> float:
        with self._moved:
            return self._now

    def time(self) -> float:
        with self._moved:
            return self._now + self._epoch_offset

    def advance(self, seconds: float) -> None:
        with self._moved:
            self._now += seconds
            self._moved.notify_all()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        with self._moved:
            self._waits[threading.current_thread().name] += 1
            deadline = self._now + timeout_s
        while not event.is_set():
            with self._moved:
                if self._now >= deadline:
                    return False
                self._moved.wait(LOOK_AGAIN_S)
        return True

    def waits_in(self, thread_name: str) -> int:
        """How many waits the thread of that name began."""
        with self._moved:
            return self._waits[thread_name]
