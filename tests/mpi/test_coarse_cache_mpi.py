"""The two-level preconditioner's coarse operator shared through ``realize --coarse-cache`` on 2 real ranks.

The small satellite (1/f noise, nside 16, coarse nside 2: 144 coarse columns at most). Realisation 0
builds the coarse operator and writes the file; realisation 1 reads it (result.json says "file", the
file's inode and mtime do not change) and gives the map a run without the cache gives (1e-10 relative
per Stokes component over the solved pixels); a damaged file is refused, rebuilt and replaced, and the
replacement is read by the next run. The runs use the numpy kernels (no compilation wait).
"""

from __future__ import annotations

import json

import healpy as hp
import numpy as np
import pytest
from mpi_support import SMALL_SATELLITE_SPEC, realize

from schemas.result import RealizationResult

pytestmark = pytest.mark.mpi

SPEC = SMALL_SATELLITE_SPEC.replace('reduction = "allreduce"', 'reduction = "allreduce"\npreconditioner = "two-level"\ncoarse_nside = 2')


def run(spec, realization, out, *extra):
    completed = realize(2, spec, realization, out, "--kernels", "numpy", *extra, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return RealizationResult.model_validate_json((out / "result.json").read_text()), completed.stderr


def read_map(out):
    return np.array(hp.read_map(out / "map_iqu.fits", field=(0, 1, 2)))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coarse")
    (folder / "spec.toml").write_text(SPEC)
    return folder


def test_the_second_realisation_reads_the_coarse_file_and_maps_agree(folder):
    spec, cache = folder / "spec.toml", folder / "coarse.npz"
    first, first_log = run(spec, 0, folder / "r0", "--coarse-cache", str(cache))
    assert first.coarse is not None and first.coarse.source == "built" and first.coarse.written
    assert first.coarse.refused is None and first.coarse.columns > 0
    assert "coarse operator written to" in first_log
    stat = cache.stat()

    second, second_log = run(spec, 1, folder / "r1", "--coarse-cache", str(cache))
    assert second.coarse is not None and second.coarse.source == "file" and not second.coarse.written
    assert second.coarse.refused is None and second.coarse.columns == first.coarse.columns
    assert f"coarse operator read from {cache}" in second_log
    assert (cache.stat().st_ino, cache.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)

    uncached, _ = run(spec, 1, folder / "r1-uncached")
    assert uncached.coarse is not None and uncached.coarse.source == "built" and not uncached.coarse.written
    assert second.converged and uncached.converged and second.iterations == uncached.iterations
    with_file, without = read_map(folder / "r1"), read_map(folder / "r1-uncached")
    solved = without[0] != hp.UNSEEN
    np.testing.assert_array_equal(with_file[0] != hp.UNSEEN, solved)
    for s in range(3):
        scale = np.max(np.abs(without[s][solved]))
        assert np.max(np.abs(with_file[s][solved] - without[s][solved])) <= 1e-10 * scale, s


def test_a_damaged_coarse_file_is_refused_rebuilt_and_replaced(folder):
    spec, cache = folder / "spec.toml", folder / "damaged.npz"
    run(spec, 0, folder / "d0", "--coarse-cache", str(cache))
    data = bytearray(cache.read_bytes())
    middle = len(data) // 2  # inside rank 0's or rank 1's A Z rows: only the zip's CRC-32 can tell
    data[middle : middle + 8] = bytes(255 - b for b in data[middle : middle + 8])
    cache.write_bytes(bytes(data))

    rebuilt, log = run(spec, 1, folder / "d1", "--coarse-cache", str(cache))
    assert rebuilt.coarse is not None and rebuilt.coarse.source == "built" and rebuilt.coarse.written
    assert rebuilt.coarse.refused is not None and "refused" in rebuilt.coarse.refused
    assert "building the coarse operator again" in log
    assert rebuilt.converged

    again, _ = run(spec, 2, folder / "d2", "--coarse-cache", str(cache))
    assert again.coarse is not None and again.coarse.source == "file" and again.coarse.refused is None


def test_the_additive_forms_file_holds_e_alone_and_is_read_on_both_ranks(folder):
    spec, cache = folder / "additive.toml", folder / "additive.npz"
    spec.write_text(SPEC.replace('preconditioner = "two-level"', 'preconditioner = "two-level-additive"'))
    first, _ = run(spec, 0, folder / "a0", "--coarse-cache", str(cache))
    second, _ = run(spec, 1, folder / "a1", "--coarse-cache", str(cache))
    assert (first.coarse.source, second.coarse.source) == ("built", "file") and second.coarse.refused is None
    with np.load(cache) as members:
        assert members["columns_0"].shape == members["columns_1"].shape == (first.coarse.columns, 0)


def test_auto_times_both_preconditioners_on_cached_realisations_then_keeps_the_faster(folder):
    """The default once the coarse file exists: realisation 1 solves with A-DEF2 and records its time, 2 with
    block-diagonal, and 3 with whichever the records say was faster (not timed). Records are JSON files in
    ``<cache>.timings/``."""
    spec, cache = folder / "auto.toml", folder / "auto.npz"
    spec.write_text(SPEC.replace('preconditioner = "two-level"\n', "").replace("realizations = 3", "realizations = 4"))  # auto
    built, _ = run(spec, 0, folder / "t0", "--coarse-cache", str(cache))
    assert built.preconditioner.name == "two-level" and not built.preconditioner.timed  # a build is no trial
    assert built.coarse.source == "built" and built.coarse.written

    two_level, log = run(spec, 1, folder / "t1", "--coarse-cache", str(cache))
    assert two_level.preconditioner.name == "two-level" and two_level.preconditioner.timed
    assert two_level.coarse.source == "file" and "trial" in two_level.preconditioner.why
    assert "solve timed for auto: two-level" in log
    block, _ = run(spec, 2, folder / "t2", "--coarse-cache", str(cache))
    assert block.preconditioner.name == "block-diagonal" and block.preconditioner.timed and block.coarse is None

    records = [json.loads(path.read_text()) for path in sorted((folder / "auto.npz.timings").glob("*.json"))]
    assert sorted(record["preconditioner"] for record in records) == ["block-diagonal", "two-level"]
    assert {record["preconditioner"]: record["iterations"] for record in records} == {
        "two-level": two_level.iterations, "block-diagonal": block.iterations}
    assert two_level.iterations < block.iterations  # what the coarse space buys, before its cost is weighed
    faster = min(records, key=lambda record: record["seconds"])["preconditioner"]

    verdict, _ = run(spec, 3, folder / "t3", "--coarse-cache", str(cache))
    assert verdict.preconditioner.name == faster and not verdict.preconditioner.timed
    assert "faster" in verdict.preconditioner.why and verdict.converged
    assert len(list((folder / "auto.npz.timings").glob("*.json"))) == 2  # the verdict's run records nothing
