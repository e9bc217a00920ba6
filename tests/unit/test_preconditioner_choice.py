"""The default preconditioner ``auto``: two-level only when its coarse operator is shared, at the finest coarse
nside whose ``A Z`` fits in memory and costs little beside the samples."""
import pytest

from mapmaker.solve.coarse import AUTO_COARSE_BYTES, AUTO_COARSE_BYTES_PER_SAMPLE, CoarseSize, choose_preconditioner

MiB = 2**20


def sizes(*per_nside: tuple[int, int, float]) -> list[CoarseSize]:
    return [CoarseSize(coarse_nside=n, bytes=b, bytes_per_sample=per) for n, b, per in per_nside]


# The figures of the measured problems (coarse.py's comment on the limits): bytes and bytes per sample of A Z.
SATELLITE = sizes((4, 345 * MiB, 50.0), (2, 86 * MiB, 12.5), (1, 22 * MiB, 3.1))
NSIDE512_20HZ = sizes((4, 15_900 * MiB, 1150.0), (2, 3_971 * MiB, 288.0), (1, 993 * MiB, 72.0))
NSIDE512_300HZ_2_RANKS = sizes((4, 7_000 * MiB, 71.0), (2, 1_762 * MiB, 17.8), (1, 441 * MiB, 4.5))


@pytest.mark.parametrize(
    ("cached", "realizations", "problem", "expected"),
    [
        (False, 1, SATELLITE, ("block-diagonal", None)),  # a one-off with nothing cached: no set-up to pay back
        (False, 2, SATELLITE, ("two-level", 4)),  # built once, read by the other realisation
        (True, 1, SATELLITE, ("two-level", 4)),  # read from the cache
        (True, 16, NSIDE512_20HZ, ("block-diagonal", None)),  # every coarse space dearer than what it saves
        (True, 16, NSIDE512_300HZ_2_RANKS, ("two-level", 2)),  # nside 4 over both limits, 2 within
        (True, 16, [], ("block-diagonal", None)),
    ],
)
def test_auto_resolves_by_sharing_and_size(cached, realizations, problem, expected):
    chosen, coarse_nside, why = choose_preconditioner("auto", cached=cached, realizations=realizations, sizes=problem)
    assert (chosen, coarse_nside) == expected and why
    if chosen == "two-level":
        assert f"coarse nside {coarse_nside}" in why


@pytest.mark.parametrize(
    ("size", "fits"),
    [
        (CoarseSize(2, AUTO_COARSE_BYTES, AUTO_COARSE_BYTES_PER_SAMPLE), True),  # both limits are inclusive
        (CoarseSize(2, AUTO_COARSE_BYTES + 1, 1.0), False),  # memory
        (CoarseSize(2, MiB, AUTO_COARSE_BYTES_PER_SAMPLE + 0.5), False),  # time: read every iteration
    ],
)
def test_each_limit_alone_refuses_a_coarse_space(size, fits):
    chosen, coarse_nside, _ = choose_preconditioner("auto", cached=True, realizations=16, sizes=[size])
    assert (chosen == "two-level") == fits and (coarse_nside == 2) == fits


@pytest.mark.parametrize("requested", ["block-diagonal", "two-level", "two-level-additive"])
def test_an_explicit_preconditioner_is_kept(requested):
    chosen, coarse_nside, _ = choose_preconditioner(requested, cached=False, realizations=1, sizes=NSIDE512_20HZ)
    assert chosen == requested and coarse_nside is None
