"""Simulated noise: its spectrum, its keys, and bit-identical reproduction."""
import numpy as np
import pytest
from mapmaker_cases import make_spec

from mapmaker.model import rng
from mapmaker.model.decomposition import chunk_layout, decompose
from mapmaker.model.noise import NoiseModel


def noise_spec(**changes):
    base = {
        "noise.f_knee_hz": 0.5,
        "noise.alpha": 1.7,
        "noise.f_min_hz": 0.02,
        "focal_plane.sample_rate_hz": 10.0,
        "scan.duration_s": 512 * 102.4,  # 512 chunks of 1024 samples
        "scan.chunk_s": 102.4,
        "focal_plane.detectors": [{"name": "A", "net_k_sqrt_s": 3e-4}, {"name": "B"}],
    }
    base.update(changes)
    return make_spec(base)


def test_averaged_periodogram_follows_the_psd():
    """Average |X_k|^2 / n over M = 512 chunks, then over bands of B = 16 frequencies.

    For a Gaussian stationary process each periodogram ordinate (0 < k < n/2)
    is S_k times an exponential variate (chi^2 with 2 dof, halved), and the
    ordinates are independent across k and across chunks. The band average
    of P_k / S_k is then a mean of M B = 8192 unit exponentials: expectation
    1, standard deviation 1 / sqrt(8192) = 1.1 %. The tolerance 5.5 % is 5
    standard deviations; over 32 bands the chance of a false failure is
    below 1e-5 (and the streams are fixed, so the test is deterministic).
    The DC ordinate (k = 0) is chi^2 with 1 dof: relative sd sqrt(2 / M) = 6 %,
    checked at 5 sd = 31 %.
    """
    spec = noise_spec()
    layout = chunk_layout(spec)
    model = NoiseModel(spec, layout)
    n, chunks = layout.samples_per_chunk, layout.n_time_chunks
    assert (n, chunks) == (1024, 512)
    periodogram = np.zeros(n // 2 + 1)
    for time_chunk in range(chunks):
        chunk = layout.chunk(time_chunk * layout.n_detectors)  # detector A
        periodogram += np.abs(np.fft.rfft(model.simulate_chunk(chunk, spec.seed, 0))) ** 2 / n
    periodogram /= chunks
    ratio = periodogram / model.psd(0, n)
    bands = ratio[1:513].reshape(32, 16).mean(axis=1)
    np.testing.assert_allclose(bands, 1.0, atol=0.055)
    assert ratio[0] == pytest.approx(1.0, abs=0.31)
    # sigma^2 = NET^2 f_s for the detector override
    assert model.white_variance[0] == pytest.approx(3e-4**2 * 10.0)


def test_same_key_gives_bit_identical_tod_and_other_realisations_differ():
    spec = noise_spec()
    layout = chunk_layout(spec)
    model = NoiseModel(spec, layout)
    chunk = layout.chunk(7)
    first = model.simulate_chunk(chunk, spec.seed, 3)
    again = NoiseModel(spec, layout).simulate_chunk(chunk, spec.seed, 3)
    assert first.tobytes() == again.tobytes()
    assert not np.allclose(model.simulate_chunk(chunk, spec.seed, 4), first)
    assert not np.allclose(model.simulate_chunk(chunk, spec.seed + 1, 3), first)
    assert not np.allclose(model.simulate_chunk(layout.chunk(8), spec.seed, 3), first)  # other detector


def test_tod_does_not_depend_on_the_rank_count():
    """The noise of a chunk is a function of the chunk alone, whichever rank simulates it."""
    spec = noise_spec(**{"noise.interval_s": 30.0})
    layout = chunk_layout(spec)
    model = NoiseModel(spec, layout)
    reference = {c.chunk_id: model.simulate_chunk(c, spec.seed, 0) for c in decompose(layout, 1).chunks_of(0)[:40]}
    for ranks in (2, 3, 7):
        decomposition = decompose(layout, ranks)
        for rank in range(ranks):
            for chunk in decomposition.chunks_of(rank):
                if chunk.chunk_id in reference:
                    assert model.simulate_chunk(chunk, spec.seed, 0).tobytes() == reference[chunk.chunk_id].tobytes()


def test_intervals_cut_chunks_and_are_numbered_globally():
    spec = noise_spec(**{"noise.interval_s": 30.0})  # 300 samples: 1024 = 3 x 300 + 124
    layout = chunk_layout(spec)
    model = NoiseModel(spec, layout)
    assert model.intervals_per_chunk == 4
    intervals = model.chunk_intervals(layout.chunk(2 * layout.n_detectors + 1))
    assert intervals == [(0, 300, 8), (300, 300, 9), (600, 300, 10), (900, 124, 11)]
    # Each interval has its own stream: the same normals are not reused across intervals.
    keys = {rng.noise_key(spec.seed, 0, 1, i) for i in range(8, 12)}
    assert len(keys) == 4


def test_keys_are_stable():
    # Pinned: changing the derivation silently would change every campaign's TOD.
    assert rng.noise_key(1, 0, 0, 0) == rng.stream_key("noise", 1, 0, 0, 0)
    key = rng.noise_key(20111112, 5, 3, 17)
    assert all(0 <= word < 2**64 for word in key)
    assert rng.generator(key).standard_normal(4).tobytes() == rng.generator(key).standard_normal(4).tobytes()
    assert rng.sky_key(1, 2, 3) != rng.sky_key(1, 2, 4) != rng.noise_key(1, 2, 3, 0)
