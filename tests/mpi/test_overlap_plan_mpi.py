"""``preprocess`` under mpiexec, the plan file, and ``realize --plan``: use, and refusal with exit code 3."""
import hashlib
import json

import healpy as hp
import numpy as np
import pytest
from mpi_support import DRIVERS, realize, run_ranks
from overlap_support import preprocess, write_spec

from mapmaker.parallel.planfile import ENTRY, HEADER
from schemas.plan import PlanReport
from schemas.result import RealizationResult

pytestmark = pytest.mark.mpi

@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plans of SPEC for 2 and 4 ranks, with their reports."""
    folder = tmp_path_factory.mktemp("plans")
    spec = write_spec(folder)
    built = {}
    for ranks in (2, 4):
        out, report = folder / f"plan{ranks}.bin", folder / f"plan{ranks}.json"
        completed = preprocess(ranks, spec, out, "--report", str(report), "--quiet")
        assert completed.returncode == 0, completed.stderr[-3000:]
        built[ranks] = (out, PlanReport.model_validate_json(report.read_text()))
    return folder, spec, built


@pytest.mark.parametrize("ranks", [1, 3])
def test_preprocess_on_other_rank_counts(tmp_path, ranks):
    spec = write_spec(tmp_path)
    completed = preprocess(ranks, spec, tmp_path / "plan.bin", "--report", str(tmp_path / "r.json"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = PlanReport.model_validate_json((tmp_path / "r.json").read_text())
    assert report.ranks == ranks and report.overlap.ranks == ranks
    if ranks == 1:
        assert report.overlap.shared_pixels.max == 0 and report.overlap.neighbours.max == 0
    assert "plan for" in completed.stderr


def test_report_describes_the_plan_file(plans):
    _, _, built = plans
    for ranks, (path, report) in built.items():
        data = path.read_bytes()
        assert report.path == str(path) and report.size_bytes == len(data)
        assert report.checksum == hashlib.sha256(data).hexdigest()
        assert report.build_time_s > 0 and report.format_version == 1 and report.ranks == ranks
        assert len(report.scan_key) == 64 and len(report.decomposition) == 64
        assert report.npix == 12 * 16**2 and report.buffer_pixels == 1000
        phases = report.phases
        assert min(phases.pointing, phases.allgather, phases.sift, phases.index, phases.write) >= 0
        overlap = report.overlap
        histogram = dict(overlap.multiplicity_histogram)
        assert sum(histogram.values()) == overlap.observed_pixels
        assert sum(m * c for m, c in histogram.items()) == overlap.total_local_pixels
        # sum_i sum_j o_ij counts each pixel m (m - 1) times.
        assert overlap.shared_pixels.mean * ranks == pytest.approx(sum(m * (m - 1) * c for m, c in histogram.items()))
        assert overlap.neighbours.max <= ranks - 1 and overlap.local_pixels.max <= overlap.observed_pixels
        # The JSON header inside the file says the same.
        fields = HEADER.unpack_from(data, 0)
        document = json.loads(data[fields[4] : fields[4] + fields[5]])
        assert document["scan_key"] == report.scan_key and document["decomposition"] == report.decomposition
        assert fields[1] == 1 and fields[2] == ranks and fields[0] == b"MCOVPLAN"


def test_realize_with_a_plan_gives_the_same_map(plans, tmp_path):
    _, spec, built = plans
    path, report = built[2]
    with_plan, without = tmp_path / "with", tmp_path / "without"
    completed = realize(2, spec, 0, with_plan, "--plan", str(path), "--quiet")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert realize(2, spec, 0, without, "--quiet").returncode == 0
    np.testing.assert_array_equal(
        hp.read_map(with_plan / "map_iqu.fits", field=(0, 1, 2)), hp.read_map(without / "map_iqu.fits", field=(0, 1, 2))
    )
    result = RealizationResult.model_validate_json((with_plan / "result.json").read_text())
    assert result.plan_checksum == report.header_checksum


# ----------------------------------------------------------------------------- refusal: exit 3, nothing written


def resign(data: bytes, old: str, new: str) -> bytes:
    """The plan with ``old`` replaced by ``new`` (same length) in its JSON header, header checksum recomputed."""
    assert len(old) == len(new)
    fields = list(HEADER.unpack_from(data, 0))
    json_offset, json_length = fields[4], fields[5]
    text = data[json_offset : json_offset + json_length].decode()
    assert old in text
    json_bytes = text.replace(old, new).encode()
    zeroed = HEADER.pack(*fields[:-1], b"\0" * 32)
    fields[-1] = hashlib.sha256(zeroed + json_bytes).digest()
    return HEADER.pack(*fields) + data[HEADER.size : json_offset] + json_bytes + data[json_offset + json_length :]


def flip_byte_in_section(data: bytes, rank: int) -> bytes:
    fields = HEADER.unpack_from(data, 0)
    offset, length, _ = ENTRY.unpack_from(data, fields[3] + rank * ENTRY.size)
    position = fields[6] + offset + length // 2
    return data[:position] + bytes([data[position] ^ 0x10]) + data[position + 1 :]


def assert_refused(completed, out, words):
    assert completed.returncode == 3, completed.stderr[-3000:]
    assert "plan refused" in completed.stderr and words in completed.stderr, completed.stderr[-3000:]
    assert completed.stderr.count("plan refused") == 1  # said once, by rank 0
    assert not out.exists()


def test_plan_for_another_rank_count_is_refused(plans, tmp_path):
    _, spec, built = plans
    out = tmp_path / "out"
    assert_refused(realize(4, spec, 0, out, "--plan", str(built[2][0])), out, "built for 2 ranks; this run has 4")


def test_plan_for_another_scan_is_refused(plans, tmp_path):
    _, _, built = plans
    other = write_spec(tmp_path, **{"spin_period_s = 60.0": "spin_period_s = 61.0"})
    out = tmp_path / "out"
    assert_refused(realize(2, other, 0, out, "--plan", str(built[2][0])), out, "scan key")


def test_plan_for_another_decomposition_is_refused(plans, tmp_path):
    _, spec, built = plans
    path, report = built[2]
    forged = tmp_path / "forged.bin"
    forged.write_bytes(resign(path.read_bytes(), report.decomposition, "0" * 64))
    out = tmp_path / "out"
    assert_refused(realize(2, spec, 0, out, "--plan", str(forged)), out, "another decomposition")


def test_plan_whose_pixels_differ_is_refused(plans, tmp_path):
    """A well-formed plan that claims this run's scan key but holds another scan's pixels."""
    folder, _, built = plans
    other = write_spec(tmp_path, **{"spin_angle_deg = 50.0": "spin_angle_deg = 70.0"})
    other_plan = tmp_path / "other.bin"
    report_path = tmp_path / "other.json"
    assert preprocess(2, other, other_plan, "--report", str(report_path), "--quiet").returncode == 0
    other_report = PlanReport.model_validate_json(report_path.read_text())
    forged = tmp_path / "forged.bin"
    forged.write_bytes(resign(other_plan.read_bytes(), other_report.scan_key, built[2][1].scan_key))
    out = tmp_path / "out"
    assert_refused(realize(2, folder / "spec.toml", 0, out, "--plan", str(forged)), out, "pixels")


@pytest.mark.parametrize("damage", ["flipped byte in rank 3's section", "truncated"])
def test_damaged_plan_is_refused(plans, tmp_path, damage):
    _, spec, built = plans
    data = built[4][0].read_bytes()
    damaged = tmp_path / "damaged.bin"
    if damage == "truncated":
        damaged.write_bytes(data[: len(data) - 1000])
        words = "truncated"
    else:
        damaged.write_bytes(flip_byte_in_section(data, 3))
        words = "checksum mismatch in rank 3's section"
    out = tmp_path / "out"
    assert_refused(realize(4, spec, 0, out, "--plan", str(damaged)), out, words)


def test_every_kind_of_damage_is_refused_on_every_rank(plans, tmp_path):
    """Header, table, size, magic, version and each rank's section, through load_plan on 4 ranks."""
    folder, _, built = plans
    completed = run_ranks(
        4, str(DRIVERS / "check_plan_refusals.py"), str(built[4][0]), str(folder / "plan4.json"), str(tmp_path),
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "refusal checks passed on 4 ranks" in completed.stdout


def test_preprocess_bad_input_exits_2(tmp_path):
    spec = write_spec(tmp_path, **{"sample_rate_hz = 5.0": "sample_rate_hz = -5.0"})
    completed = preprocess(2, spec, tmp_path / "plan.bin")
    assert completed.returncode == 2 and "focal_plane.sample_rate_hz" in completed.stderr
    assert not (tmp_path / "plan.bin").exists()
    good = write_spec(tmp_path, name="good.toml")
    completed = preprocess(2, good, tmp_path)
    assert completed.returncode == 2 and "is a folder" in completed.stderr
