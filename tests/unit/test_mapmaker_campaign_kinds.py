"""Campaign kinds in the map-maker: what each simulates, and how the sky and noise vary with the realisation.

The ML map is linear in the data, and with white noise all three kinds weight
samples alike (signal-only by the white level it does not simulate), so the
signal+noise map is the signal-only map plus the noise-only map to round-off.
"""

import healpy as hp
import numpy as np
from mapmaker_cases import COLOCATED_QUAD, make_spec
from mpi4py import MPI

from mapmaker.model.sky import build_sky
from mapmaker.programs.realize import rng_stream_records
from mapmaker.solve.realization import run_realization

CHANGES = {"focal_plane.detectors": COLOCATED_QUAD, "solver.tol": 1e-12}


def solve(kind, realization=0, **top):
    spec = make_spec(CHANGES, kind=kind, **top)
    return spec, run_realization(spec, realization, MPI.COMM_SELF)


def solved(outcome):
    return outcome.iqu[0] != hp.UNSEEN


def test_signal_plus_noise_is_signal_only_plus_noise_only():
    _, both = solve("signal+noise")
    _, signal = solve("signal-only")
    _, noise = solve("noise-only")
    pixels = solved(both)
    np.testing.assert_array_equal(pixels, solved(signal))
    np.testing.assert_array_equal(pixels, solved(noise))
    for stokes in range(3):
        scale = np.abs(both.iqu[stokes, pixels]).max()
        np.testing.assert_allclose(
            both.iqu[stokes, pixels], signal.iqu[stokes, pixels] + noise.iqu[stokes, pixels], rtol=0, atol=1e-9 * scale
        )


def test_signal_only_simulates_no_noise_and_noise_only_no_sky():
    spec, signal = solve("signal-only")
    sky = build_sky(spec, 0, None)
    pixels = solved(signal)
    for stokes in range(3):  # noiseless: the input sky at the pixel centres comes back
        scale = np.abs(sky[stokes, pixels]).max()
        np.testing.assert_allclose(signal.iqu[stokes, pixels], sky[stokes, pixels], rtol=0, atol=1e-8 * scale)
    streams, total = rng_stream_records(spec, 0)
    assert [s["stream"] for s in streams] == ["sky"] and total == 1

    spec, noise = solve("noise-only")
    assert build_sky(spec, 0, None) is None
    streams, total = rng_stream_records(spec, 0)
    assert {s["stream"] for s in streams} == {"noise"} and total > 1
    assert np.std(noise.iqu[0, solved(noise)]) > 0


def test_sky_and_noise_change_with_the_realisation_and_the_campaign_seed():
    spec = make_spec(CHANGES, kind="signal+noise")
    sky_0, sky_1 = build_sky(spec, 0, None), build_sky(spec, 1, None)
    assert not np.allclose(sky_0, sky_1)
    np.testing.assert_array_equal(sky_0, build_sky(spec, 0, None))  # reproducible
    other_seed = make_spec(CHANGES, kind="signal+noise", seed=spec.seed + 1)
    assert not np.allclose(sky_0, build_sky(other_seed, 0, None))
    signal_only = make_spec(CHANGES, kind="signal-only")
    np.testing.assert_array_equal(build_sky(signal_only, 1, None), sky_1)  # same keys: (seed, sky seed, realisation)

    _, noise_0 = solve("noise-only", 0)
    _, noise_1 = solve("noise-only", 1)
    pixels = solved(noise_0)
    assert not np.allclose(noise_0.iqu[:, pixels], noise_1.iqu[:, pixels])
