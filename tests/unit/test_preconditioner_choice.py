"""The default preconditioner ``auto``: two-level only when its coarse operator is shared and fits."""
import pytest

from mapmaker.solve.coarse import AUTO_COARSE_BYTES, choose_preconditioner


@pytest.mark.parametrize(
    ("cached", "realizations", "coarse_bytes", "expected"),
    [
        (False, 1, 1000, "block-diagonal"),  # a one-off with nothing cached: no set-up to pay back
        (False, 2, 1000, "two-level"),  # built once, read by the other realisation
        (True, 1, 1000, "two-level"),  # read from the cache
        (True, 16, AUTO_COARSE_BYTES, "two-level"),
        (True, 16, AUTO_COARSE_BYTES + 1, "block-diagonal"),  # A Z too large to hold and read every iteration
    ],
)
def test_auto_resolves_by_sharing_and_size(cached, realizations, coarse_bytes, expected):
    chosen, why = choose_preconditioner("auto", cached=cached, realizations=realizations, coarse_bytes=coarse_bytes)
    assert chosen == expected and why


@pytest.mark.parametrize("requested", ["block-diagonal", "two-level", "two-level-additive"])
def test_an_explicit_preconditioner_is_kept(requested):
    chosen, _ = choose_preconditioner(requested, cached=False, realizations=1, coarse_bytes=10 * AUTO_COARSE_BYTES)
    assert chosen == requested
