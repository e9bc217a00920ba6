"""Focal planes from TOAST files: reading, selection, refusals, the scan key, pointing and noise against TOAST.

The files are written at test time by TOAST 3 itself (``Focalplane.save_hdf5``, see
``tests/support/toast_files.py``), and TOAST's own operators give the reference pointing.
"""

from __future__ import annotations

import copy
import hashlib

import h5py
import healpy as hp
import numpy as np
import pytest
from mapmaker_cases import BASE
from mpi4py import MPI
from pydantic import ValidationError

from campaignlib.instrument import FocalPlaneFileError, read_focal_plane, resolve_focal_plane
from mapmaker.kernels import pointing
from mapmaker.model.decomposition import chunk_layout
from mapmaker.model.noise import NoiseModel
from mapmaker.model.scan import ChunkPointing, boresight_quaternions, detector_quaternions
from mapmaker.solve.realization import run_realization
from schemas.spec import CampaignSpec, FocalPlaneNotRead, scan_key
from tests.support.toast_files import detector_quat, focal_plane_table, hexagon_focal_plane, write_focal_plane

ARCSEC = np.pi / (180 * 3600)


def file_spec(file: str, sha256: str, select: dict | None = None, **changes) -> CampaignSpec:
    data = copy.deepcopy(BASE)
    data["focal_plane"] = {"sample_rate_hz": 5.0, "file": file, "sha256": sha256, "select": select or {}}
    data.update(changes)
    return CampaignSpec.model_validate(data)


def quad_table(names, offset_x_deg, net, **columns):
    """Detectors at 0/45/90/135 degrees, co-located at (offset_x_deg, 0), all with NET ``net``."""
    angles = [0.0, 45.0, 90.0, 135.0]
    quats = np.array([detector_quat(offset_x_deg, 0.0, a) for a in angles])
    return focal_plane_table(names, quats, net=[net] * 4, pol_angle_deg=angles, **columns)


@pytest.fixture
def hexagon(tmp_path):
    sha = hexagon_focal_plane(tmp_path / "hex.h5", n_pix=7)
    return tmp_path, sha


# --------------------------------------------------------------------------- reading and selection


def test_a_toast_file_gives_each_detector_its_quaternion_and_noise(hexagon):
    root, sha = hexagon
    spec = resolve_focal_plane(file_spec("hex.h5", sha), root)
    rows = spec.focal_plane.detector_rows
    assert len(rows) == 14  # 7 pixels, two detectors each
    import toast.io
    from toast.instrument import Focalplane

    with toast.io.H5File(str(root / "hex.h5"), "r", comm=None) as handle:
        reference = Focalplane.load_hdf5(handle.handle, comm=None)
    for row in rows:
        np.testing.assert_allclose(row.quat, reference[row.name]["quat"], rtol=0, atol=1e-15)
        assert row.net_k_sqrt_s == pytest.approx(100e-6) and row.f_knee_hz == pytest.approx(0.05)
        assert row.alpha == pytest.approx(1.0) and row.f_min_hz == pytest.approx(1e-4)
    assert spec.total_samples == 14 * spec.samples_per_detector


def test_the_selection_takes_part_of_the_focal_plane(tmp_path):
    names = [f"W{w}_{b}_{i}" for w in (0, 1) for b in ("f090", "f150") for i in range(4)]
    quats = np.array([detector_quat(0.1 * i, 0.0, 0.0) for i in range(len(names))])
    table = focal_plane_table(
        names, quats, net=50e-6, wafer=[n.split("_")[0] for n in names], band=[n.split("_")[1] for n in names]
    )
    sha = write_focal_plane(tmp_path / "fp.h5", table)

    def selected(select):
        return [d.name for d in resolve_focal_plane(file_spec("fp.h5", sha, select), tmp_path).focal_plane.detector_rows]

    assert len(selected({})) == 16
    assert selected({"wafer": "W1", "band": "f150"}) == [f"W1_f150_{i}" for i in range(4)]
    assert selected({"names": "W0_*_3"}) == ["W0_f090_3", "W0_f150_3"]
    assert selected({"band": "f090", "first": 5}) == ["W0_f090_0", "W0_f090_1", "W0_f090_2", "W0_f090_3", "W1_f090_0"]


def test_the_file_checksum_and_the_selection_enter_the_scan_key(tmp_path):
    table = quad_table(["a", "b", "c", "d"], 0.5, 100e-6)
    sha = write_focal_plane(tmp_path / "one.h5", table)
    same = file_spec("one.h5", sha)
    assert scan_key(same) == scan_key(file_spec("elsewhere/renamed.h5", sha))  # the content, not the name
    assert scan_key(same) != scan_key(file_spec("one.h5", sha, {"first": 2}))
    moved = focal_plane_table(["a", "b", "c", "d"], table["quat"], net=100e-6)
    moved["quat"][0] = detector_quat(0.6, 0.0, 0.0)
    other_sha = write_focal_plane(tmp_path / "two.h5", moved)
    assert other_sha != sha and scan_key(file_spec("two.h5", other_sha)) != scan_key(same)
    assert scan_key(resolve_focal_plane(file_spec("one.h5", sha), tmp_path)) == scan_key(same)  # reading changes nothing


def test_an_unread_file_focal_plane_is_an_error_not_an_empty_list(tmp_path):
    spec = file_spec("fp.h5", "0" * 64)
    with pytest.raises(FocalPlaneNotRead):
        _ = spec.focal_plane.detector_rows


@pytest.mark.parametrize(
    "focal_plane, message",
    [
        ({"file": "fp.h5"}, "needs its sha256"),
        ({"file": "fp.h5", "sha256": "0" * 64, "detectors": [{"name": "A"}]}, "either detectors"),
        ({"file": "../fp.h5", "sha256": "0" * 64}, "'..'"),
        ({"file": "fp.fits", "sha256": "0" * 64}, "HDF5"),
        ({"detectors": [{"name": "A"}], "select": {"first": 1}}, "go with file"),
        ({"detectors": [{"name": "A", "quat": [0, 0, 0, 2]}]}, "unit quaternion"),
    ],
)
def test_the_spec_refuses_a_malformed_focal_plane_form(focal_plane, message):
    data = copy.deepcopy(BASE)
    data["focal_plane"] = focal_plane
    with pytest.raises(ValidationError, match=message):
        CampaignSpec.model_validate(data)


# --------------------------------------------------------------------------- refusals


def drop_column(path, column):
    """Rewrite a TOAST file without one of its table's columns (astropy keeps the units of the others)."""
    from astropy.table import QTable

    table = QTable.read(path, path="focalplane")
    table.remove_column(column)
    path.unlink()
    table.write(path, path="focalplane", serialize_meta=True)


@pytest.mark.parametrize(
    "damage, column, words",
    [
        ("drop psd_net", "psd_net", "missing"),
        ("drop quat", "quat", "missing"),
        ("nan psd_fknee", "psd_fknee", "has no value"),
        ("net in watts", "psd_net", "cannot be read"),
        ("truncate", "", "not a readable HDF5"),
        ("wafer select without column", "wafer", "missing"),
    ],
)
def test_malformed_files_are_refused_naming_the_file_and_the_column(tmp_path, damage, column, words):
    path = tmp_path / "bad.h5"
    select = {}
    table = quad_table(["a", "b", "c", "d"], 0.5, 100e-6)
    if damage == "nan psd_fknee":
        table["psd_fknee"][2] = np.nan * table["psd_fknee"].unit
    if damage == "net in watts":
        import astropy.units as u

        table["psd_net"] = table["psd_net"].value * u.W
    write_focal_plane(path, table)
    if damage.startswith("drop"):
        drop_column(path, column)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:500])
    if damage.startswith("wafer"):
        select = {"wafer": "W0"}
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(FocalPlaneFileError) as caught:
        read_focal_plane(file_spec("bad.h5", sha, select).focal_plane, tmp_path)
    assert caught.value.file == "bad.h5" and caught.value.column == column
    assert "bad.h5" in str(caught.value) and words in str(caught.value)
    if column:
        assert repr(column) in str(caught.value)


def test_a_changed_file_is_refused_by_its_checksum(tmp_path):
    sha = write_focal_plane(tmp_path / "fp.h5", quad_table(["a", "b", "c", "d"], 0.5, 100e-6))
    write_focal_plane(tmp_path / "fp.h5", quad_table(["a", "b", "c", "d"], 0.7, 100e-6))
    with pytest.raises(FocalPlaneFileError, match="sha256"):
        resolve_focal_plane(file_spec("fp.h5", sha), tmp_path)
    with pytest.raises(FocalPlaneFileError, match="instrument_root"):
        resolve_focal_plane(file_spec("fp.h5", sha), None)


def test_a_corrupt_table_is_not_an_hdf5_focal_plane(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as handle:
        handle["something_else"] = np.arange(3)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(FocalPlaneFileError, match="focalplane"):
        resolve_focal_plane(file_spec("other.h5", sha), tmp_path)


# --------------------------------------------------------------------------- pointing against TOAST


@pytest.mark.parametrize("scan_kind", ["satellite", "ground"])
def test_detector_pointing_matches_toast_for_the_same_boresight(hexagon, scan_kind):
    """TOAST's PointingDetectorSimple + StokesWeights on our boresight: directions within 1 arcsec, equal weights.

    The boresight quaternions of one chunk of each scan family are handed to a TOAST observation
    (TOAST's component order [x, y, z, w]); TOAST rotates each detector by its quaternion from the file.
    """
    import astropy.units as u
    import toast
    import toast.ops
    import toast.qarray as qa
    from toast.instrument import Focalplane, SpaceSite, Telescope

    root, sha = hexagon
    scan = {"kind": "ground", "duration_s": 3600.0, "chunk_s": 900.0} if scan_kind == "ground" else BASE["scan"]
    spec = resolve_focal_plane(file_spec("hex.h5", sha, scan=scan), root)
    layout = chunk_layout(spec)
    times = np.arange(layout.samples_per_chunk) / spec.focal_plane.sample_rate_hz
    bore = boresight_quaternions(spec.scan, times)  # [n, 4] scalar first
    n = len(times)

    import toast.io

    with toast.io.H5File(str(root / "hex.h5"), "r", comm=None) as handle:
        focal_plane = Focalplane.load_hdf5(handle.handle, comm=None)
    comm = toast.Comm(world=None)
    observation = toast.Observation(comm, Telescope("t", focalplane=focal_plane, site=SpaceSite("s")), n_samples=n)
    observation.shared.create_column("boresight", (n, 4), dtype=np.float64)
    observation.shared["boresight"].set(bore[:, [1, 2, 3, 0]], offset=(0, 0), fromrank=0)
    observation.shared.create_column("flags", (n,), dtype=np.uint8)
    data = toast.Data(comm)
    data.obs.append(observation)
    detector_pointing = toast.ops.PointingDetectorSimple(boresight="boresight", quats="quats")
    toast.ops.StokesWeights(mode="IQU", detector_pointing=detector_pointing, weights="weights").apply(data)
    assert u.Quantity(focal_plane.sample_rate).to_value(u.Hz) == spec.focal_plane.sample_rate_hz

    ours = detector_quaternions(spec.focal_plane)
    worst = 0.0
    for index, detector in enumerate(spec.focal_plane.detector_rows):
        theta, phi, _ = pointing.detector_angles(bore, ours[index])
        direction = hp.ang2vec(theta, phi)
        reference = qa.rotate(observation.detdata["quats"][detector.name], np.array([0.0, 0.0, 1.0]))
        separation = np.arctan2(np.linalg.norm(np.cross(direction, reference), axis=1), np.sum(direction * reference, axis=1))
        worst = max(worst, float(separation.max()))
        _, weights = pointing.detector_pointing(bore, ours[index], spec.pixelization.nside)
        np.testing.assert_allclose(weights, observation.detdata["weights"][detector.name], rtol=0, atol=1e-9)
    assert worst < 1.0 * ARCSEC


# --------------------------------------------------------------------------- per-detector noise in the map


def test_per_detector_noise_levels_show_in_the_white_noise_chi_square(tmp_path):
    """Two co-located quads with NETs 100 and 300 uK sqrt(s), white noise, nside 32, noise-only.

    Each detector's noise is drawn with its own NET and weighted by it; the 3x3 inverse covariance of
    each pixel is built here from the pointing and the NETs of the file (not from the noise model):
    ``H = sum_samples w w^T / sigma_d^2``. Then ``e^T H e / 3`` averages to 1 (about 12,000 pixels, three
    dof each: sd 0.7 %); 5 % is the issue's bound. One campaign-wide NET would miss: against it the
    same errors give a chi^2 far from 1.
    """
    nets = {"lo": 100e-6, "hi": 300e-6}
    lo = quad_table([f"lo{i}" for i in range(4)], 0.5, nets["lo"])
    hi = quad_table([f"hi{i}" for i in range(4)], -0.5, nets["hi"])
    from astropy.table import vstack

    sha = write_focal_plane(tmp_path / "two.h5", vstack([lo, hi]))
    spec = file_spec(
        "two.h5", sha, kind="noise-only", pixelization={"nside": 32},
        scan={**BASE["scan"], "duration_s": 21600.0, "chunk_s": 1800.0},
    )  # fmt: skip
    spec = resolve_focal_plane(spec, tmp_path)
    outcome = run_realization(spec, 0, MPI.COMM_SELF)

    layout = chunk_layout(spec)
    rate = spec.focal_plane.sample_rate_hz
    sigma2 = np.array([nets[d.name[:2]] ** 2 * rate for d in spec.focal_plane.detector_rows])
    npix = spec.pixelization.npix
    blocks = np.zeros((npix, 3, 3))
    one_level = np.zeros((npix, 3, 3))  # the same with every detector at the campaign-wide NET
    chunk_pointing = ChunkPointing(spec, layout)
    for time_chunk in range(layout.n_time_chunks):
        for detector in range(layout.n_detectors):
            pixels, weights = chunk_pointing(time_chunk, detector)
            outer = weights[:, :, None] * weights[:, None, :] / sigma2[detector]
            np.add.at(blocks, pixels, outer)
            np.add.at(one_level, pixels, outer * sigma2[detector] / (spec.noise.net_k_sqrt_s**2 * rate))
    solved = outcome.iqu[0] != hp.UNSEEN
    assert solved.sum() > 10_000
    errors = outcome.iqu[:, solved].T  # [n_solved, 3] (K); the input sky is zero
    chi2 = np.mean(np.einsum("pi,pij,pj->p", errors, blocks[solved], errors)) / 3
    assert chi2 == pytest.approx(1.0, abs=0.05)

    # The noise model used the file's levels; a chi^2 against one campaign-wide level is far from 1.
    model = NoiseModel(spec, layout)
    np.testing.assert_allclose(model.white_variance, sigma2, rtol=1e-12)
    chi2_one_level = np.mean(np.einsum("pi,pij,pj->p", errors, one_level[solved], errors)) / 3
    assert chi2_one_level > 1.5
