"""Bandpower products in the service (transfer function, noise bias, covariance) and the spectrum of a data map,
with known answers on a masked sky, on SQLite and PostgreSQL.

The realisations are made by the real bandpower code (``mapmaker.model.bandpowers``) on healpy skies of a known
C_l: nside 64, a galactic cut |b| > 14 deg apodised over 5 deg (fsky 0.76, effective 0.72), bins of 16,
the standard estimator (the pure one also purifies E, which the Knox formula does not describe). They are
delivered through the worker API as a worker would (the mask file uploaded, the result reported), so the
result hook builds the aggregates. Bins judged: from 2 bin widths to 2 nside (5 bins), as in
``tests/unit/test_bandpowers.py``. Monte Carlo errors and tolerances are stated per test.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import subprocess
from pathlib import Path

import healpy as hp
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import mapcampaign
from benchmarks._support import result_for, spec_data
from mapcampaign.errors import InvalidRequest
from mapmaker.model import bandpowers as bp
from mapmaker.model.sky import load_fiducial_cls, synthesize_cmb
from schemas.api import API_PREFIX
from schemas.result import SPECTRA
from tests.api.conftest import Api
from tests.support.databases import on_database
from tests.support.live_service import mapcampaign_command
from tests.support.mapped_campaign import deliver, deliver_all
from tests.support.service_helpers import auth

NSIDE = 64
BIN_WIDTH = 16
SIGMA_T = 60e-6  # K per pixel; sigma_P = sqrt(2) sigma_T
COUNTS = {"signal-only": 12, "noise-only": 12, "signal+noise": 120}


def fiducial_cls() -> np.ndarray:
    return np.ascontiguousarray(load_fiducial_cls().T)  # [4, n_ell] TT EE BB TE, K^2, from ell 0


def campaign_spec(kind: str, **changes) -> dict:
    sky = {"kind": "none"} if kind == "noise-only" else {"kind": "cmb"}
    settings = {"pixelization.nside": NSIDE, "products.ell_bin_width": BIN_WIDTH, "products.purify_b": False}
    return spec_data(kind=kind, realizations=COUNTS[kind], sky=sky, **{**settings, **changes})


class Skies:
    """The mask, coupling and generators shared by every campaign of the module (and the data map)."""

    def __init__(self, folder: Path):
        self.folder = folder
        npix = hp.nside2npix(NSIDE)
        sine_latitude = np.array(hp.pix2vec(NSIDE, np.arange(npix)))[2]
        hits = (np.abs(sine_latitude) > math.sin(math.radians(14.0))).astype(int)
        self.mask = bp.analysis_mask(hits, apodisation_deg=5.0)
        self.binning = bp.Binning.for_nside(NSIDE, BIN_WIDTH)
        self.coupling = bp.build_coupling(self.mask, self.binning, purify_b=False)
        self.cls = fiducial_cls()
        self.noise_level = SIGMA_T**2 * 4 * math.pi / npix  # white pixel noise: flat N_l, no pixel window
        noise_cls = np.zeros_like(self.cls)
        noise_cls[:3] = np.array([1.0, 2.0, 2.0])[:, None] * self.noise_level
        self.model = bp.model_bandpowers(self.coupling, self.cls)
        self.total = bp.model_bandpowers(self.coupling, self.cls + noise_cls)
        mask_file = folder / "mask.fits"
        hp.write_map(str(mask_file), self.mask, dtype=np.float64, column_names=["MASK"])
        self.mask_bytes = mask_file.read_bytes()

    def sky_map(self, kind: str, generator: np.random.Generator) -> np.ndarray:
        npix = hp.nside2npix(NSIDE)
        iqu = np.zeros((3, npix))
        if kind != "noise-only":
            iqu += synthesize_cmb(self.cls.T, NSIDE, 3 * NSIDE - 1, 0.0, generator)
        if kind != "signal-only":
            per_field = np.array([SIGMA_T, math.sqrt(2) * SIGMA_T, math.sqrt(2) * SIGMA_T])[:, None]
            iqu += generator.standard_normal((3, npix)) * per_field
        return iqu

    def realization_folder(self, spec: dict, kind: str, index: int, generator: np.random.Generator) -> Path:
        """A product folder as a worker uploads it: the mask and a result whose spectra are real bandpowers."""
        iqu = self.sky_map(kind, generator)
        cleaned = iqu.copy()
        cleaned[0], monopole, dipole = bp.remove_monopole_dipole(iqu[0], self.mask)
        cb = bp.decoupled_bandpowers(cleaned, self.coupling).cb
        folder = self.folder / f"{kind}-{index:04d}"
        folder.mkdir(parents=True)
        (folder / "mask.fits").write_bytes(self.mask_bytes)
        product = {
            "name": "mask",
            "path": "mask.fits",
            "sha256": hashlib.sha256(self.mask_bytes).hexdigest(),
            "size_bytes": len(self.mask_bytes),
        }
        result = result_for(spec, index, [product])
        values = {name: [float(v) for v in cb[row]] for row, name in enumerate(SPECTRA)}
        signal = kind != "noise-only"
        result["spectra"] = {
            "ell_min": [int(v) for v in self.binning.ell_lo],
            "ell_max": [int(v) for v in self.binning.ell_hi],
            "lmax": self.binning.lmax,
            "ell_bin_width": BIN_WIDTH,
            "cl": values,  # the pseudo-spectra are not what these tests judge
            "w2": float(np.mean(self.mask**2)),
            "fsky": float(np.mean(self.mask > 0)),
            "apodization_deg": 5.0,
            "min_hits": 1,
            "signal": signal,
            "noise": kind != "signal-only",
            "monopole_k": monopole,
            "dipole_k": [float(v) for v in dipole],
            "bandpowers": {
                "ell_lo": [int(v) for v in self.binning.ell_lo],
                "ell_hi": [int(v) for v in self.binning.ell_hi],
                "lmax": self.binning.lmax,
                "bin_width": BIN_WIDTH,
                "reliable": [bool(v) for v in self.binning.reliable_bins],
                "purify_b": False,
                "cb": values,
                "model": {name: [float(v) for v in self.model[row]] for row, name in enumerate(SPECTRA)}
                if signal
                else None,
                "mask_sha256": self.coupling.mask_sha256,
                "coupling_source": "built",
                "bandpowers_s": 0.1,
            },
        }
        (folder / "result.json").write_text(json.dumps(result))
        return folder


@pytest.fixture(scope="module")
def skies(tmp_path_factory):
    """Every realisation folder of the three campaigns, and an independent signal+noise data map (FITS bytes)."""
    folder = tmp_path_factory.mktemp("bandpower-skies")
    with threadpool_limits(limits=1, user_api="openmp"):  # pspy's OpenMP threads spin-wait on a busy machine
        made = Skies(folder)
        folders = {}
        for seed, kind in enumerate(COUNTS):
            generator = np.random.default_rng(100 + seed)
            spec = campaign_spec(kind)
            folders[kind] = (spec, [made.realization_folder(spec, kind, i, generator) for i in range(COUNTS[kind])])
        data = made.sky_map("signal+noise", np.random.default_rng(999))
        data[0] += 3e-3  # an offset the spectrum must not see (removed over the mask, as in every realisation)
        data_file = folder / "data.fits"
        hp.write_map(str(data_file), data, dtype=np.float64)
    return made, folders, data_file.read_bytes()


def run_campaign(api: Api, spec: dict, folders: list[Path]) -> int:
    answer = api.post("/campaigns", json=spec)
    assert answer.status_code == 201, answer.text
    campaign_id = answer.json()["id"]
    worker = api.register(name=f"w{campaign_id}", capacity=64)
    delivered = 0
    while delivered < len(folders):
        tasks = api.claim(worker, max_tasks=64)
        assert tasks, "nothing to claim"
        for task in tasks:
            if task["kind"] == "preprocess":
                assert api.plan_built(task["task_id"]).status_code == 200
                continue
            answer = deliver(
                api.client, task, folders[task["realization"]], prefix=API_PREFIX, headers=auth(api.alice_worker)
            )
            assert answer.status_code == 200, answer.text
            delivered += 1
    return campaign_id


def refolder(spec: dict, folder: Path, target: Path) -> Path:
    """A copy of a realisation's product folder for a campaign of another spec (its hash and scan key)."""
    result = json.loads((folder / "result.json").read_text())
    fresh = result_for(spec, result["realization"], result["products"])
    fresh["spectra"] = result["spectra"]
    target.mkdir(parents=True)
    (target / "mask.fits").write_bytes((folder / "mask.fits").read_bytes())
    (target / "result.json").write_text(json.dumps(fresh))
    return target


def small_campaigns(api: Api, skies, tmp_path: Path) -> dict[str, int]:
    """Two realisations of each kind: enough for every refusal, cheap to deliver."""
    _, folders, _ = skies
    ids = {}
    for kind, (_, paths) in folders.items():
        spec = {**campaign_spec(kind), "realizations": 2}
        ids[kind] = run_campaign(api, spec, [refolder(spec, path, tmp_path / kind / path.name) for path in paths[:2]])
    return ids


def judged(made: Skies) -> np.ndarray:
    return (made.binning.ell_lo >= 2 + 2 * BIN_WIDTH) & made.binning.reliable_bins


def bandpowers_of(api: Api, campaign_id: int) -> dict:
    answer = api.get(f"/campaigns/{campaign_id}/products")
    assert answer.status_code == 200, answer.text
    return answer.json()["bandpowers"]


def test_bandpower_products_and_the_spectrum_of_a_data_map(api, skies):
    """Every campaign delivered once (144 realisations); the checks below share them."""
    _, folders, _ = skies
    campaigns = {kind: run_campaign(api, spec, paths) for kind, (spec, paths) in folders.items()}
    check_transfer_noise_bias_and_covariance(api, skies, campaigns)
    check_the_bandpower_downloads(api, skies, campaigns)
    check_the_client_arrays(api, skies, campaigns)
    check_the_spectrum_of_an_independent_map(api, skies, campaigns)


def check_transfer_noise_bias_and_covariance(api, skies, campaigns):
    """Transfer (signal-only, 12 skies): TT and EE F_b within 5% of 1, per-bin MC error 1-2%.
    Noise bias (noise-only, 12 maps): N_b within 5% of sigma^2 Omega_pix (x2 for EE, BB), MC error 1-2%.
    Covariance (signal+noise, 120 skies): MC variance / Knox averaged over the 5 judged bins within 20% of 1
    (one bin's variance from 120 skies has a relative error of 13%, the 5-bin mean 6%), with n and Hartlap."""
    made, _, _ = skies
    bins = judged(made)
    assert bins.sum() == 5
    transfer = bandpowers_of(api, campaigns["signal-only"])
    assert transfer["n"] == 12 and transfer["noise_bias"] is None and transfer["covariance"] is None
    for name in ("TT", "EE"):
        value = np.array(transfer["transfer_function"][name]["value"])[bins]
        error = np.array(transfer["transfer_function"][name]["error"])[bins]
        assert np.all(error < 0.025), f"{name}: MC error {error} must be well below the 5% tolerance"
        assert np.all(np.abs(value - 1) < 0.05), f"{name}: F_b = {value} (MC error {error})"
    np.testing.assert_allclose(
        [transfer["model"]["TT"]], [made.model[0]], rtol=1e-12
    )  # the model the realisations carried

    noise = bandpowers_of(api, campaigns["noise-only"])
    assert noise["transfer_function"] is None and noise["model"] is None
    for name, level in (("TT", made.noise_level), ("EE", 2 * made.noise_level), ("BB", 2 * made.noise_level)):
        ratio = np.array(noise["noise_bias"][name]["value"])[bins] / level
        error = np.array(noise["noise_bias"][name]["error"])[bins] / level
        assert np.all(error < 0.025) and np.all(np.abs(ratio - 1) < 0.05), f"{name}: N_b / level {ratio} ({error})"

    total = bandpowers_of(api, campaigns["signal+noise"])
    covariance = total["covariance"]
    p = 6 * made.binning.n_bins
    assert covariance["n"] == 120 and covariance["p"] == p
    assert covariance["hartlap"] == pytest.approx((120 - p - 2) / 119)
    fsky = bp.effective_fsky(made.mask)
    n_modes = (2 * made.binning.ell_centre + 1) * (made.binning.ell_hi - made.binning.ell_lo + 1) * fsky
    for row, name in enumerate(("TT", "EE", "BB")):
        knox = 2 * made.total[row] ** 2 / n_modes
        ratio = (np.array(covariance["std"][name]) ** 2 / knox)[bins]
        assert abs(ratio.mean() - 1) < 0.2, f"{name}: MC variance / Knox = {ratio} (mean {ratio.mean():.3f})"


def check_the_bandpower_downloads(api, skies, campaigns):
    """The npz, FITS and JSON downloads hold the covariance matrix numpy computes from the stored bandpowers."""
    made, folders, _ = skies
    campaign_id = campaigns["signal+noise"]
    samples = np.array(
        [
            [json.loads((path / "result.json").read_text())["spectra"]["bandpowers"]["cb"][name] for name in SPECTRA]
            for path in folders["signal+noise"][1]
        ]
    )
    expected = np.cov(samples.reshape(len(samples), -1), rowvar=False, ddof=1)
    answer = api.get(f"/campaigns/{campaign_id}/products/bandpowers", params={"format": "npz"})
    assert answer.status_code == 200, answer.text
    with np.load(io.BytesIO(answer.content)) as stored:
        scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))
        assert np.all(np.abs(stored["covariance"] - expected) <= 1e-9 * scale)
        np.testing.assert_allclose(stored["mean"], samples.mean(axis=0), rtol=1e-9, atol=1e-9 * np.abs(samples).max())
        assert int(stored["n"]) == 120 and str(stored["kind"]) == "signal+noise"

    answer = api.get(f"/campaigns/{campaign_id}/products/bandpowers", params={"format": "fits"})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/fits"
    from astropy.io import fits

    with fits.open(io.BytesIO(answer.content)) as hdus:
        assert hdus["COVARIANCE"].header["N"] == 120
        np.testing.assert_allclose(hdus["COVARIANCE"].data, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
        assert list(hdus["BANDPOWERS"].data["ELL_LO"]) == list(made.binning.ell_lo)

    document = api.get(f"/campaigns/{campaign_id}/products/bandpowers", params={"format": "json"}).json()
    assert document["scan_key"] and len(document["covariance_matrix"]) == 6 * made.binning.n_bins
    summary = api.get(f"/campaigns/{campaign_id}/products").json()
    assert summary["downloads"]["bandpowers"] == f"{API_PREFIX}/campaigns/{campaign_id}/products/bandpowers"


def spectrum(api: Api, map_bytes: bytes, **campaign_ids):
    return api.post("/spectrum", params=campaign_ids, content=map_bytes, headers={"Content-Type": "application/fits"})


def user_client(api: Api) -> mapcampaign.Client:
    """The public client on the in-process app (TestClient's transport)."""
    return mapcampaign.Client(server="http://testserver", token=api.alice, transport=api.client._transport)


def check_the_client_arrays(api, skies, campaigns):
    """``client.products(id).bandpowers`` and ``client.bandpower_covariance(id)`` as numpy."""
    made, _, _ = skies
    with user_client(api) as client:
        transfer = client.products(campaigns["signal-only"]).bandpowers
        total = client.products(campaigns["signal+noise"]).bandpowers
        covariance, n, hartlap = client.bandpower_covariance(campaigns["signal+noise"])
        with pytest.raises(InvalidRequest, match="signal\\+noise campaign"):
            client.bandpower_covariance(campaigns["noise-only"])
    assert transfer.transfer.shape == (6, made.binning.n_bins) and transfer.noise_bias is None
    np.testing.assert_allclose(transfer.model, made.model, rtol=1e-12)
    assert n == total.covariance_n == 120 and hartlap == pytest.approx(total.hartlap)
    np.testing.assert_allclose(np.sqrt(np.diag(covariance)).reshape(6, -1), total.covariance_std, rtol=1e-12)


def check_the_spectrum_of_an_independent_map(api, skies, campaigns):
    """An independent signal+noise map (not one of the realisations, with a 3 mK offset): (C_b - N_b) / F_b
    recovers the input C_b (through the windows) within 3 sigma of the MC covariance in >= 95% of the bins of
    TT, EE, BB and TE, and the offset is removed."""
    made, _, data = skies
    answer = spectrum(
        api,
        data,
        transfer=campaigns["signal-only"],
        noise=campaigns["noise-only"],
        covariance=campaigns["signal+noise"],
    )
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["covariance_n"] == 120 and result["monopole_k"] == pytest.approx(3e-3, rel=0.01)
    inside = []
    for name in ("TT", "EE", "BB", "TE"):
        row = SPECTRA.index(name)
        value, error = np.array(result["cb"][name], dtype=float), np.array(result["error"][name], dtype=float)
        inside.extend(np.abs(value - made.model[row]) < 3 * error)
    assert np.mean(inside) >= 0.95, f"{np.mean(inside):.2%} of the bins within 3 sigma"
    assert result["error"]["EB"] == [None] * made.binning.n_bins  # F_b is undefined where the model is 0
    # The mask's coupling was built once and kept by the service, named by the coupling key and the mask.
    (kept,) = api.settings.coupling_cache_dir.glob("*.npz")
    assert kept.name.endswith(f"-{result['mask_sha256']}.npz")
    built = kept.stat()

    # The same through the Python client, without a covariance campaign: the same values, no errors.
    data_file = made.folder / "data.fits"
    with user_client(api) as client:
        without = client.spectrum(data_file, transfer=campaigns["signal-only"], noise=campaigns["noise-only"])
    assert without.error is None and without.cb["TT"] == result["cb"]["TT"]
    reread = kept.stat()  # read, not built again: a rebuild writes a new file (atomic rename: a new inode)
    assert (reread.st_ino, reread.st_mtime_ns) == (built.st_ino, built.st_mtime_ns)
    assert list(api.settings.spectrum_work_dir.iterdir()) == []  # each request's map removed


def problem(answer) -> tuple[str, str]:
    assert answer.status_code == 422, answer.text
    (only,) = answer.json()["detail"]
    return only["field"], only["msg"]


def test_a_wrong_combination_is_refused_naming_what_differs(api, skies, tmp_path):
    made, folders, data = skies
    campaigns = small_campaigns(api, skies, tmp_path)
    ids = {"transfer": campaigns["signal-only"], "noise": campaigns["noise-only"]}
    field, message = problem(spectrum(api, data, transfer=campaigns["noise-only"], noise=campaigns["noise-only"]))
    assert field == "query.transfer" and "noise-only" in message and "signal-only" in message
    field, message = problem(spectrum(api, data, **ids, covariance=campaigns["signal-only"]))
    assert field == "query.covariance" and "signal+noise" in message

    # a noise campaign of another pointing (scan key) whose realisations had another mask
    other = {**campaign_spec("noise-only", **{"scan.duration_s": 7200.0}), "realizations": 1}
    target = refolder(other, folders["noise-only"][1][0], tmp_path / "other-noise")
    result = json.loads((target / "result.json").read_text())
    result["spectra"]["bandpowers"]["mask_sha256"] = "0" * 64
    (target / "result.json").write_text(json.dumps(result))
    other_id = run_campaign(api, other, [target])
    field, message = problem(spectrum(api, data, transfer=ids["transfer"], noise=other_id))
    assert field == "query.noise" and "scan key" in message and "mask sha256" in message, message

    low = made.sky_map("signal+noise", np.random.default_rng(5))
    low_file = tmp_path / "nside32.fits"
    hp.write_map(str(low_file), hp.ud_grade(low, 32), dtype=np.float64, overwrite=True)
    field, message = problem(spectrum(api, low_file.read_bytes(), **ids))
    assert field == "body" and "nside 32" in message and "nside 64" in message
    field, message = problem(spectrum(api, b"not a FITS file", **ids))
    assert field == "body" and "not a HEALPix FITS map" in message
    i_only = tmp_path / "i_only.fits"
    hp.write_map(str(i_only), made.sky_map("signal+noise", np.random.default_rng(6))[0], dtype=np.float64)
    field, message = problem(spectrum(api, i_only.read_bytes(), **ids))
    assert field == "body" and "1 field" in message and "I, Q and U" in message and "zeros" in message, message
    field, message = problem(spectrum(api, b"", **ids))
    assert field == "body"
    unlabelled = api.post("/spectrum", params=ids, content=data, headers={"Content-Type": "application/octet-stream"})
    assert unlabelled.status_code == 415 and "application/fits" in unlabelled.json()["detail"]
    assert spectrum(api, data, transfer=ids["transfer"], noise=ids["noise"], covariance=10**9).status_code == 404


def test_the_transfer_function_is_f_b_on_the_dashboard_with_unreliable_bins_flagged(api, skies, tmp_path):
    """A signal-only masked campaign of 12 realisations: the panel shows F_b before the pseudo-C_l ratio F_l,
    which is labelled a full-sky approximation; the F_b chart flags the bins above 2 nside and those where F_b
    is poorly determined (BB on a masked sky: E leaks into B, its error is far above 20%), not TT and EE
    in the judged bins; the bandpowers are on the products page and download from it."""
    made, folders, _ = skies
    spec = {**campaign_spec("signal-only"), "name": "F_b chart"}
    paths = [refolder(spec, path, tmp_path / path.name) for path in folders["signal-only"][1]]
    for path in paths:  # the pseudo-C_l model too, so the panel has F_l as well
        result = json.loads((path / "result.json").read_text())
        result["spectra"]["model"] = {name: [float(v) for v in made.model[row]] for row, name in enumerate(SPECTRA)}
        (path / "result.json").write_text(json.dumps(result))
    campaign_id = run_campaign(api, spec, paths)
    api.client.cookies.clear()
    login = api.client.post("/login", data={"token": api.alice, "next": "/"}, follow_redirects=False)
    assert login.status_code == 303, login.text
    page = api.client.get(f"/campaigns/{campaign_id}").text
    assert page.index('data-chart="mc-bandpower-transfer"') < page.index('data-chart="mc-transfer"')
    assert "Transfer function F_b" in page and "full-sky approximation, biased on a masked sky" in page

    chart = api.client.get(f"/ui/campaigns/{campaign_id}/products/bandpower-transfer").json()
    assert chart["yScale"] == "linear" and chart["scales"] == ["linear", "symlog"] and chart["reference"] == 1.0
    series = {s["label"]: s for s in chart["series"]}
    above = ~made.binning.reliable_bins
    assert above.any() and chart["shade"][0]["from"] == float(made.binning.ell_lo[np.argmax(above)])
    for name in ("TT", "EE", "BB"):
        assert np.array(series[name]["flagged"])[above].all(), name
    for name in ("TT", "EE"):
        assert not np.array(series[name]["flagged"])[judged(made)].any(), name
    assert np.array(series["BB"]["flagged"])[made.binning.reliable_bins].any()

    products = api.client.get("/products").text
    assert f'href="/campaigns/{campaign_id}/downloads/bandpowers.fits"' in products
    download = api.client.get(f"/campaigns/{campaign_id}/downloads/bandpowers.npz")
    assert download.status_code == 200
    with np.load(io.BytesIO(download.content)) as stored:
        assert int(stored["n"]) == 12 and str(stored["kind"]) == "signal-only"


# --------------------------------------------------------------------------- CLI against a live service


def run_spectrum_cli(service, *args: str) -> subprocess.CompletedProcess:
    env = {**service.env, "MAPCAMPAIGN_TOKEN": service.user_token}
    return subprocess.run(
        mapcampaign_command("spectrum", *args), env=env, capture_output=True, check=False, text=True, timeout=600
    )


# The command is under test: the in-process tests above run its requests on both databases.
@on_database("sqlite")
def test_cli_spectrum_prints_the_bandpowers_and_refuses_a_wrong_combination(live_service, skies, tmp_path):
    """Small campaigns (2 realisations each) on a live service: the command's --json is the API's answer, its
    table prints D_b; a noise-only campaign given as --transfer exits 2 naming the option's field."""
    _, folders, data = skies
    user = live_service.client(live_service.user_token)
    worker = live_service.client(live_service.worker_token)
    worker_id = worker.post("/workers", json={"name": "cli-spectrum", "site": "local", "host": "h", "capacity": 8})
    worker_id = worker_id.json()["id"]
    ids = {}
    for kind, (_, paths) in folders.items():
        spec = {**campaign_spec(kind), "realizations": 2}
        created = user.post("/campaigns", json=spec)
        assert created.status_code == 201, created.text
        ids[kind] = created.json()["id"]
        copies = [refolder(spec, path, tmp_path / kind / path.name) for path in paths[:2]]
        deliver_all(worker, worker_id, copies)
    data_file = tmp_path / "data.fits"
    data_file.write_bytes(data)
    options = ["--transfer", str(ids["signal-only"]), "--noise", str(ids["noise-only"])]
    done = run_spectrum_cli(live_service, str(data_file), *options, "--covariance", str(ids["signal+noise"]), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["covariance_n"] == 2 and answer["campaigns"]["transfer"] == ids["signal-only"]
    assert len(answer["cb"]["TT"]) == len(answer["bins"]["ell_lo"]) and answer["error"]["TT"][0] > 0

    table = run_spectrum_cli(live_service, str(data_file), *options)
    assert table.returncode == 0, table.stderr
    assert "D_b in uK^2" in table.stdout and "no errors" in table.stdout
    assert "the beam is not deconvolved" in table.stdout
    # two realisations cannot determine F_b of BB on a masked sky: starred, and a warning names the bins
    assert "F_b is poorly determined" in table.stderr and "BB " in table.stderr.split("trusted:")[1], table.stderr
    assert "*" in table.stdout
    first = answer["bins"]["ell_center"][0]
    d_tt = first * (first + 1) * answer["cb"]["TT"][0] / (2 * math.pi) * 1e12
    assert f"{d_tt:.4g}" in table.stdout

    wrong = run_spectrum_cli(live_service, str(data_file), "--transfer", str(ids["noise-only"]), "--noise", "1")
    assert wrong.returncode == 2 and "query.transfer" in wrong.stderr and "noise-only" in wrong.stderr, wrong.stderr
    missing = run_spectrum_cli(live_service, str(tmp_path / "absent.fits"), *options)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    i_only = tmp_path / "i-only.fits"
    hp.write_map(str(i_only), hp.read_map(str(data_file), field=0), dtype=np.float64)
    refused = run_spectrum_cli(live_service, str(i_only), *options)
    assert refused.returncode == 2 and "1 field(s)" in refused.stderr and "I, Q and U" in refused.stderr

    products = subprocess.run(
        mapcampaign_command("products", str(ids["signal-only"]), "--out", str(tmp_path / "fb")),
        env={**live_service.env, "MAPCAMPAIGN_TOKEN": live_service.user_token},
        capture_output=True, check=False, text=True, timeout=600,
    )  # fmt: skip
    assert products.returncode == 0, products.stderr
    assert "transfer function F_b" in products.stdout and "F_l" not in products.stdout
    assert (tmp_path / "fb" / "bandpowers.fits").is_file()
