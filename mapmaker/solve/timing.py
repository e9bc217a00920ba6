"""Wall-clock accounting of one rank, split into calc, comm and io."""
from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager

KINDS = ("calc", "comm", "io")


class Timers:
    """Seconds spent per kind; ``with timers("comm"): ...`` adds the block's wall time."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[kind] += time.perf_counter() - start

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def peak_memory_mib() -> float:
    """Peak resident set size of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
