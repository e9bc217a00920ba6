"""The worker's clock: what its loop and threads read the time from and wait on.

The agent, its threads and the tasks it holds take a :class:`Clock` instead of calling :mod:`time`, so a test
moves time forward (``tests/support/clock.py``) rather than waiting for it to pass. ``monotonic()`` measures
intervals (seconds, never going back); ``time()`` stamps moments (seconds since the epoch, for reports);
``wait(event, timeout_s)`` sleeps until ``event`` is set or ``timeout_s`` seconds passed and says whether it was set.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals and deadlines)."""
        ...

    def time(self) -> float:
        """Seconds since the epoch (for stamps a report carries)."""
        ...

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        """Wait until ``event`` is set or ``timeout_s`` seconds passed; True when the event was set."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time`, :meth:`threading.Event.wait`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(timeout_s)


SYSTEM_CLOCK: Clock = SystemClock()
