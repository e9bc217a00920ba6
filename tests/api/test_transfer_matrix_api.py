"""The E/B transfer matrix as a product (``GET /api/v1/transfer-matrix``) and the matrix-corrected spectrum of a
data map (``POST /api/v1/spectrum?transfer_e=..&transfer_b=..``), on SQLite and PostgreSQL.

The realisations are real pure-B MASTER bandpowers (``mapmaker.model.bandpowers``) of the map-maker's own pure-E
and pure-B skies (``mapmaker.model.sky.sky_input_cls``) at nside 32 on a galactic cut apodised over 5 deg, where
pure B leaks E into B by up to several lensing BBs. They are delivered through the worker API as a worker would,
so the result hook builds the aggregates. The known answers are numpy's: the matrix of the delivered bandpowers
(:func:`campaignlib.montecarlo.transfer_matrix_from_samples`), and the correction of the data map's bandpowers with
it, to rounding.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from pathlib import Path

import healpy as hp
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from benchmarks._support import result_for, spec_data
from campaignlib import montecarlo
from mapmaker.model import bandpowers as bp
from mapmaker.model.sky import sky_input_cls, synthesize_cmb
from schemas.result import SPECTRA
from schemas.spec import CmbSky
from tests.api.test_bandpowers_api import problem, refolder, run_campaign, run_spectrum_cli, spectrum
from tests.api.test_products_api import login
from tests.support.databases import on_database
from tests.support.mapped_campaign import deliver_all

NSIDE = 32
BIN_WIDTH = 8
SIGMA_T = 20e-6  # K per pixel of the noise maps
COUNTS = {"E-only": 8, "B-only": 8, "noise-only": 4, "signal+noise": 6}


def campaign_spec(role: str, **changes) -> dict:
    kind = role if role in ("noise-only", "signal+noise") else "signal-only"
    sky = {"kind": "none"} if kind == "noise-only" else {"kind": "cmb"}
    if role in ("E-only", "B-only"):
        sky["polarization"] = role
    settings = {"pixelization.nside": NSIDE, "products.ell_bin_width": BIN_WIDTH}
    return spec_data(kind=kind, realizations=COUNTS.get(role, 2), sky=sky, **{**settings, **changes})


class PureSkies:
    def __init__(self, folder: Path):
        self.folder = folder
        npix = hp.nside2npix(NSIDE)
        sine_latitude = np.array(hp.pix2vec(NSIDE, np.arange(npix)))[2]
        self.mask = bp.analysis_mask((np.abs(sine_latitude) > math.sin(math.radians(20.0))).astype(int), apodisation_deg=5.0)
        self.binning = bp.Binning.for_nside(NSIDE, BIN_WIDTH)
        self.coupling = bp.build_coupling(self.mask, self.binning, purify_b=True)
        self.cls = {role: sky_input_cls(CmbSky(polarization=role)) for role in ("E-only", "B-only", "both")}
        mask_file = folder / "mask.fits"
        hp.write_map(str(mask_file), self.mask, dtype=np.float64, column_names=["MASK"])
        self.mask_bytes = mask_file.read_bytes()
        self.samples: dict[str, list[np.ndarray]] = {role: [] for role in COUNTS}

    def model(self, role: str) -> np.ndarray:
        cls = self.cls["both" if role == "signal+noise" else role]
        return bp.model_bandpowers(self.coupling, np.ascontiguousarray(cls[: 3 * NSIDE].T))

    def sky_map(self, role: str, generator: np.random.Generator, bb_factor: float = 1.0) -> np.ndarray:
        iqu = np.zeros((3, hp.nside2npix(NSIDE)))
        if role != "noise-only":
            cls = self.cls["both" if role == "signal+noise" else role].copy()
            cls[:, 2] *= bb_factor
            iqu += synthesize_cmb(cls, NSIDE, 3 * NSIDE - 1, 0.0, generator)
        if role in ("noise-only", "signal+noise"):
            iqu += generator.standard_normal(iqu.shape) * (SIGMA_T * np.array([1.0, math.sqrt(2), math.sqrt(2)]))[:, None]
        return iqu

    def bandpowers(self, iqu: np.ndarray) -> np.ndarray:
        cleaned = iqu.copy()
        cleaned[0], _, _ = bp.remove_monopole_dipole(iqu[0], self.mask)
        return bp.decoupled_bandpowers(cleaned, self.coupling).cb

    def realization_folder(
        self, spec: dict, role: str, index: int, generator, *, mask_sha256: str | None = None, under: Path | None = None
    ) -> Path:
        """A product folder as a worker uploads it; its bandpowers join ``samples`` unless it claims another mask."""
        cb = self.bandpowers(self.sky_map(role, generator))
        if mask_sha256 is None:
            self.samples[role].append(cb)
        folder = (under or self.folder) / f"{role}-{index:04d}"
        folder.mkdir(parents=True)
        (folder / "mask.fits").write_bytes(self.mask_bytes)
        product = {"name": "mask", "path": "mask.fits", "sha256": hashlib.sha256(self.mask_bytes).hexdigest(),
                   "size_bytes": len(self.mask_bytes)}
        result = result_for(spec, index, [product])
        values = {name: [float(v) for v in cb[row]] for row, name in enumerate(SPECTRA)}
        signal = role != "noise-only"
        model = self.model(role) if signal else None
        result["spectra"] = {
            "ell_min": [int(v) for v in self.binning.ell_lo], "ell_max": [int(v) for v in self.binning.ell_hi],
            "lmax": self.binning.lmax, "ell_bin_width": BIN_WIDTH, "cl": values,
            "w2": float(np.mean(self.mask**2)), "fsky": float(np.mean(self.mask > 0)),
            "apodization_deg": 5.0, "min_hits": 1, "signal": signal, "noise": role in ("noise-only", "signal+noise"),
            "monopole_k": 0.0, "dipole_k": [0.0, 0.0, 0.0],
            "bandpowers": {
                "ell_lo": [int(v) for v in self.binning.ell_lo], "ell_hi": [int(v) for v in self.binning.ell_hi],
                "lmax": self.binning.lmax, "bin_width": BIN_WIDTH,
                "reliable": [bool(v) for v in self.binning.reliable_bins], "purify_b": True, "cb": values,
                "model": None if model is None else {name: [float(v) for v in model[row]] for row, name in enumerate(SPECTRA)},
                "mask_sha256": mask_sha256 or self.coupling.mask_sha256, "coupling_source": "built", "bandpowers_s": 0.1,
            },
        }
        (folder / "result.json").write_text(json.dumps(result))
        return folder


@pytest.fixture(scope="module")
def skies(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pure-skies")
    with threadpool_limits(limits=1, user_api="openmp"):
        made = PureSkies(folder)
        folders = {}
        for seed, role in enumerate(COUNTS):
            generator = np.random.default_rng(380 + seed)
            spec = campaign_spec(role)
            folders[role] = (spec, [made.realization_folder(spec, role, i, generator) for i in range(COUNTS[role])])
        data = made.sky_map("signal+noise", np.random.default_rng(3899), bb_factor=10.0)
        data_file = folder / "data.fits"
        hp.write_map(str(data_file), data, dtype=np.float64)
        expected_data_cb = made.bandpowers(data)
    return made, folders, data_file.read_bytes(), expected_data_cb


def expected_matrix(made: PureSkies) -> montecarlo.TransferMatrix:
    return montecarlo.transfer_matrix_from_samples(
        np.array(made.samples["E-only"]), made.model("E-only"), np.array(made.samples["B-only"]), made.model("B-only")
    )


def values(nested) -> np.ndarray:
    return np.array(nested, dtype=float)  # None (null) becomes NaN


def test_the_matrix_product_follows_the_realisations_and_the_corrected_spectrum_uses_it(api, skies):
    made, folders, data, data_cb = skies
    spec_e, paths_e = folders["E-only"]
    first = run_campaign(api, {**spec_e, "realizations": 3}, paths_e[:3])
    spec_b, paths_b = folders["B-only"]
    pure_b = run_campaign(api, spec_b, paths_b)
    answer = api.get("/transfer-matrix", params={"pure_e": first, "pure_b": pure_b})
    assert answer.status_code == 200, answer.text
    early = answer.json()
    assert early["n_e"] == 3 and early["n_b"] == COUNTS["B-only"] and early["spectra"] == ["EE", "EB", "BB"]
    three = montecarlo.transfer_matrix_from_samples(
        np.array(made.samples["E-only"][:3]), made.model("E-only"), np.array(made.samples["B-only"]), made.model("B-only")
    )
    np.testing.assert_allclose(values(early["matrix"]), three.matrix, rtol=1e-9, atol=1e-12)

    pure_e = run_campaign(api, spec_e, paths_e)  # all 8: the product is of the aggregates as they stand
    matrix = expected_matrix(made)
    answer = api.get("/transfer-matrix", params={"pure_e": pure_e, "pure_b": pure_b})
    product = answer.json()
    assert product["n_e"] == COUNTS["E-only"] and product["bins"]["reliable"] == [bool(v) for v in made.binning.reliable_bins]
    np.testing.assert_allclose(values(product["matrix"]), matrix.matrix, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(values(product["error"]), matrix.error, rtol=1e-6, atol=1e-12)
    judged = made.binning.reliable_bins & (made.binning.ell_lo >= 2 + 2 * BIN_WIDTH)
    assert np.all(values(product["matrix"])[judged, 2, 0] > 0)  # E -> B leakage, measured
    npz = api.get("/transfer-matrix", params={"pure_e": pure_e, "pure_b": pure_b, "format": "npz"})
    assert npz.status_code == 200 and "attachment" in npz.headers["content-disposition"]
    with np.load(io.BytesIO(npz.content)) as stored:
        np.testing.assert_allclose(stored["matrix"], matrix.matrix, rtol=1e-9, atol=1e-12)
        assert list(stored["spectra"]) == ["EE", "EB", "BB"] and int(stored["n_e"]) == COUNTS["E-only"]

    # The dashboard: each campaign of the pair charts the matrix of the latest partner with its coupling key.
    login(api, api.alice)
    page = api.client.get(f"/campaigns/{pure_b}").text
    assert 'data-chart="mc-transfer-matrix"' in page and f"of campaigns {pure_e} (pure E) and {pure_b}" in page
    chart = api.client.get(f"/ui/campaigns/{pure_e}/products/transfer-matrix").json()
    assert chart["yScale"] == "symlog" and chart["shade"][0]["label"] == "above 2 nside"
    leakage = next(series for series in chart["series"] if series["label"] == "E→B")
    assert leakage["flagged"] == [not v for v in made.binning.reliable_bins]
    unit = chart["unit"]
    np.testing.assert_allclose(values(leakage["y"]) * unit, matrix.matrix[:, 2, 0], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(
        (values(leakage["hi"]) - values(leakage["y"])) * unit, matrix.error[:, 2, 0], rtol=1e-6, atol=1e-15
    )

    noise = run_campaign(api, *folders["noise-only"])
    total = run_campaign(api, *folders["signal+noise"])
    assert 'data-chart="mc-transfer-matrix"' not in api.client.get(f"/campaigns/{noise}").text
    answer = spectrum(api, data, transfer_e=pure_e, transfer_b=pure_b, noise=noise, covariance=total)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["correction"] == "transfer-matrix" and result["campaigns"]["transfer"] is None
    for row, name in enumerate(SPECTRA):  # the map-maker's program computed what numpy does here
        np.testing.assert_allclose(result["data_cb"][name], data_cb[row], rtol=1e-6, atol=1e-6 * np.abs(data_cb[row]).max())
    noise_samples, total_samples = np.array(made.samples["noise-only"]), np.array(made.samples["signal+noise"])
    transfer_b, _ = montecarlo.transfer_function(np.array(made.samples["E-only"]), made.model("E-only"))
    expected = montecarlo.matrix_debiased_bandpowers(
        values([result["data_cb"][name] for name in SPECTRA]), noise_bias_cb=noise_samples.mean(axis=0),
        matrix=matrix, transfer_b=transfer_b, covariance=montecarlo.bandpower_covariance(total_samples)[0],
    )
    for row, name in enumerate(SPECTRA):
        if name == "TB":  # F_b is undefined where the model is 0
            assert result["cb"][name] == [None] * made.binning.n_bins
            continue
        np.testing.assert_allclose(values(result["cb"][name]), expected.cb[row], rtol=1e-8, atol=0)
        np.testing.assert_allclose(values(result["error"][name]), expected.sigma_data[row], rtol=1e-6)
        np.testing.assert_allclose(values(result["error_matrix"][name]), expected.sigma_matrix[row], rtol=1e-6)
    np.testing.assert_allclose(values(result["transfer_matrix"]["matrix"]), matrix.matrix, rtol=1e-9, atol=1e-12)


def test_a_wrong_pair_is_refused_naming_the_field(api, skies, tmp_path):
    made, folders, data, _ = skies
    pure_e = run_campaign(api, {**folders["E-only"][0], "realizations": 2}, folders["E-only"][1][:2])
    pure_b = run_campaign(api, {**folders["B-only"][0], "realizations": 2}, folders["B-only"][1][:2])
    noise = run_campaign(api, {**folders["noise-only"][0], "realizations": 2}, folders["noise-only"][1][:2])
    field, message = problem(api.get("/transfer-matrix", params={"pure_e": pure_b, "pure_b": pure_b}))
    assert field == "query.pure_e" and "'B-only'" in message and "'E-only'" in message
    field, message = problem(api.get("/transfer-matrix", params={"pure_e": pure_e, "pure_b": noise}))
    assert field == "query.pure_b" and "noise-only" in message
    field, message = problem(spectrum(api, data, transfer_e=pure_e, transfer_b=pure_e, noise=noise))
    assert field == "query.transfer_b" and "'E-only'" in message
    field, message = problem(spectrum(api, data, transfer_e=pure_e, noise=noise))
    assert field == "query.transfer_b"
    field, message = problem(spectrum(api, data, transfer=pure_e, transfer_e=pure_e, transfer_b=pure_b, noise=noise))
    assert field == "query.transfer" and "not both" in message
    field, message = problem(spectrum(api, data, noise=noise))
    assert field == "query.transfer"

    # a pure-B campaign whose realisations were made on another mask (another coupling)
    spec = campaign_spec("B-only", **{"products.apodization_deg": 4.0})
    spec["realizations"] = 2
    generator = np.random.default_rng(1)
    other = [
        made.realization_folder(spec, "B-only", i, generator, mask_sha256="0" * 64, under=tmp_path) for i in range(2)
    ]
    other_id = run_campaign(api, spec, other)
    field, message = problem(api.get("/transfer-matrix", params={"pure_e": pure_e, "pure_b": other_id}))
    assert field == "query.pure_b" and "mask sha256" in message and "coupling key" in message


# The command is under test: the in-process tests above run its requests on both databases.
@on_database("sqlite")
def test_cli_spectrum_with_a_transfer_matrix_pair(live_service, skies, tmp_path):
    """``mapcampaign spectrum --transfer-e ID --transfer-b ID`` on a live service (2 realisations each): its --json
    is the API's matrix-corrected answer, its table marks the matrix's error; a pair with --transfer, or half a
    pair, exits 2 before any request."""
    _, folders, data, _ = skies
    user = live_service.client(live_service.user_token)
    worker = live_service.client(live_service.worker_token)
    worker_id = worker.post("/workers", json={"name": "cli-matrix", "site": "local", "host": "h", "capacity": 8})
    worker_id = worker_id.json()["id"]
    ids = {}
    for role in ("E-only", "B-only", "noise-only"):
        spec, paths = folders[role]
        spec = {**spec, "realizations": 2}
        created = user.post("/campaigns", json=spec)
        assert created.status_code == 201, created.text
        ids[role] = created.json()["id"]
        copies = [refolder(spec, path, tmp_path / role / path.name) for path in paths[:2]]
        deliver_all(worker, worker_id, copies)
    data_file = tmp_path / "data.fits"
    data_file.write_bytes(data)
    pair = ["--transfer-e", str(ids["E-only"]), "--transfer-b", str(ids["B-only"]), "--noise", str(ids["noise-only"])]
    done = run_spectrum_cli(live_service, str(data_file), *pair, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["correction"] == "transfer-matrix" and answer["transfer_matrix"]["n_e"] == 2
    assert answer["campaigns"]["transfer_e"] == ids["E-only"] and answer["error_matrix"]["BB"][3] > 0
    table = run_spectrum_cli(live_service, str(data_file), *pair)
    assert table.returncode == 0, table.stderr
    assert "E/B transfer matrix of campaigns" in table.stdout and "(+" in table.stdout

    both = run_spectrum_cli(live_service, str(data_file), "--transfer", str(ids["E-only"]), *pair)
    assert both.returncode == 2 and "not both" in both.stderr
    half = run_spectrum_cli(live_service, str(data_file), "--transfer-e", str(ids["E-only"]), "--noise", "1")
    assert half.returncode == 2 and "--transfer-b" in half.stderr
