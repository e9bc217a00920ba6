"""Chunks in time-major order, assigned contiguously and balanced; the fingerprint."""
import numpy as np
import pytest
from mapmaker_cases import make_spec

from mapmaker.model.decomposition import ChunkLayout, chunk_layout, decompose, decomposition_fingerprint


def test_layout_is_time_major_with_a_short_last_chunk():
    layout = ChunkLayout(n_detectors=3, samples_per_detector=1000, samples_per_chunk=300)
    assert layout.n_time_chunks == 4 and layout.n_chunks == 12
    assert [(c.time_chunk, c.detector) for c in map(layout.chunk, range(4))] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    last = layout.chunk(11)
    assert (last.first_sample, last.n_samples) == (900, 100)
    assert layout.chunk_samples().sum() == 3000


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7, 12, 20])
def test_ranges_are_contiguous_complete_and_balanced(ranks):
    layout = ChunkLayout(n_detectors=3, samples_per_detector=1000, samples_per_chunk=300)
    decomposition = decompose(layout, ranks)
    assert decomposition.ranges[0][0] == 0 and decomposition.ranges[-1][1] == layout.n_chunks
    for (_, end), (start, _) in zip(decomposition.ranges, decomposition.ranges[1:]):
        assert end == start
    loads = np.array([decomposition.samples_of(r) for r in range(ranks)])
    assert loads.sum() == 3000
    assert np.all(np.abs(loads - 3000 / ranks) <= 300)  # within one chunk of the mean
    if ranks > layout.n_chunks:
        assert sum(1 for r in decomposition.ranges if r[0] == r[1]) >= ranks - layout.n_chunks


def test_fingerprint_names_the_assignment():
    spec = make_spec()
    layout = chunk_layout(spec)
    two, again, four = decompose(layout, 2), decompose(chunk_layout(make_spec()), 2), decompose(layout, 4)
    assert decomposition_fingerprint(two) == decomposition_fingerprint(again)
    assert decomposition_fingerprint(two) != decomposition_fingerprint(four)
    other = decompose(chunk_layout(make_spec({"scan.chunk_s": 600.0})), 2)
    assert decomposition_fingerprint(other) != decomposition_fingerprint(two)
    assert len(decomposition_fingerprint(two)) == 64
