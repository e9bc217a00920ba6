"""N^-1 per interval length: the four-step transform against one ducc0 FFT (where FOUR_STEP_MIN_SAMPLES comes from).

    .venv/bin/python benchmarks/bench_fft.py                         # the documented run: 12M samples per length
    .venv/bin/python benchmarks/bench_fft.py --lengths 72000,360000 --rounds 9

For each even interval length n, ``--samples`` samples of intervals (at least two intervals) are
filtered in place by :class:`mapmaker.kernels.noise_fast.CirculantFilter` twice over: once through
one half-length complex FFT (``four_step_from`` out of reach), once through the four-step split of
n/2 (``four_step_from=0``). The intervals are far apart in a fresh array, so each one comes from
memory as in a PCG iteration. The two take turns for ``--rounds`` rounds (order reversed every round,
so a slow spell of a shared machine falls on both); printed per length: each one's median seconds per
round, the FFT flop rate of that median (``mapmaker.programs.bench.fft_flops``: 2 x 2.5 n log2 n per interval)
and the median and range of the per-round ratio one-FFT / four-step (> 1: the four-step is faster).
Wall clock; one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._support import add_json_option, write_json
from mapmaker.kernels.noise_fast import FOUR_STEP_MIN_SAMPLES, CirculantFilter, balanced_split
from mapmaker.programs.bench import fft_flops, interleaved_rounds

DEFAULT_LENGTHS = (36_000, 72_000, 131_072, 200_000, 262_144, 360_000, 720_000)


def time_length(n: int, samples: int, rounds: int) -> dict:
    """Per-round seconds of both paths over ``samples`` samples of n-sample intervals, and the ratios."""
    if n % 2 or n < 4:
        raise ValueError(f"interval length {n}: the four-step needs an even length of at least 4")
    rng = np.random.default_rng(n)
    inverse_psd = rng.uniform(0.5, 2.0, n // 2 + 1)
    paths = {
        "one FFT": CirculantFilter(inverse_psd, n, four_step_from=sys.maxsize),
        "four-step": CirculantFilter(inverse_psd, n, four_step_from=0),
    }
    count = max(2, samples // n)
    tod = rng.standard_normal(count * n)
    for circulant in paths.values():  # compile and touch every page once
        circulant.apply(tod[:n])

    def timed_pass(circulant: CirculantFilter) -> SimpleNamespace:
        def run() -> float:
            start = time.perf_counter()
            for i in range(count):
                circulant.apply(tod[i * n : (i + 1) * n])
            return time.perf_counter() - start

        return SimpleNamespace(run=run)

    # the map-maker bench's turn order (reversed every round) and its flop count
    seconds = interleaved_rounds({name: timed_pass(circulant) for name, circulant in paths.items()}, rounds)
    ratios = [one / four for one, four in zip(seconds["one FFT"], seconds["four-step"], strict=True)]
    flops = fft_flops([n] * count)
    return {
        "length": n,
        "intervals": count,
        "split": balanced_split(n // 2),
        "median_seconds": {name: statistics.median(values) for name, values in seconds.items()},
        "gflops": {name: flops / statistics.median(values) / 1e9 for name, values in seconds.items()},
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="comma-separated even interval lengths (samples)"
    )
    parser.add_argument("--samples", type=int, default=12_000_000, help="samples of intervals per length")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the two paths taking turns")
    add_json_option(parser)
    args = parser.parse_args(argv)
    quiet = args.json == "-"  # stdout holds only the JSON
    try:
        lengths = [int(text) for text in args.lengths.split(",") if text.strip()]
    except ValueError:
        parser.error(f"--lengths: comma-separated integers, got {args.lengths!r}")
    bad = [n for n in lengths if n % 2 or n < 4]
    if bad:
        parser.error(f"--lengths: the four-step needs even lengths of at least 4, got {bad}")
    if args.samples < 1 or args.rounds < 1:
        parser.error("--samples and --rounds must be at least 1")

    results = []
    if not quiet:
        print(
            f"bench_fft: {args.samples:,} samples per length, {args.rounds} rounds, load average "
            f"{os.getloadavg()[0]:.2f}; the map-maker uses the four-step from {FOUR_STEP_MIN_SAMPLES:,}"
        )
        print(
            f"{'length':>9} {'split':>11} {'one FFT s':>10} {'GFlop/s':>8} {'four-step s':>12} {'GFlop/s':>8}"
            "  one/four (range)"
        )
    for n in lengths:
        result = time_length(n, args.samples, args.rounds)
        results.append(result)
        if not quiet:
            split = "x".join(map(str, result["split"])) if result["split"] else "none"
            one, four = result["median_seconds"]["one FFT"], result["median_seconds"]["four-step"]
            low, high = result["ratio_range"]
            print(
                f"{n:>9,} {split:>11} {one:>10.4f} {result['gflops']['one FFT']:>8.1f} {four:>12.4f} "
                f"{result['gflops']['four-step']:>8.1f}  {result['ratio_median']:.2f}x ({low:.2f}-{high:.2f})"
            )
    write_json(args.json, {"four_step_min_samples": FOUR_STEP_MIN_SAMPLES, "lengths": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
