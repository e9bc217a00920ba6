"""Monte Carlo products in the service, on SQLite and PostgreSQL, with real map-maker outputs.

Realisations of a tiny noise-only campaign are mapped once per module by what
``python -m mapmaker realize`` runs, under ``mpiexec -n 2`` and delivered through
the real worker API (uploads + success report), so the result hook, the
reconciler, the endpoints, the dashboard panel and the CLI all see what a
worker would send.

"Equal to the batch" means ``|running - numpy| <= 1e-12 * scale`` per bin
or pixel, with ``scale`` the RMS of the values there (the mean of a noise
map or of a cross spectrum crosses zero, so a relative error against the
mean itself would be meaningless); standard deviations within 1e-10
relative (ddof = 1 on both sides).
"""

from __future__ import annotations

import io
import json
import subprocess

import healpy as hp
import numpy as np
import pytest
from fastapi.testclient import TestClient

from schemas.api import API_PREFIX
from schemas.result import SPECTRA
from service.app import create_app
from service.campaigns.hooks import on_result_accepted, remove_result_hook
from service.config import Settings
from service.products.reconcile import update_after_result
from tests.api.conftest import Api
from tests.support.databases import on_database
from tests.support.live_service import mapcampaign_command
from tests.support.mapped_campaign import deliver, map_realizations, read_result, spec_json, write_spec
from tests.support.service_helpers import auth
from tests.support.worker_helpers import wait_for

REALIZATIONS = 5


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mapped")
    spec_path = write_spec(folder)
    return spec_json(spec_path), map_realizations(spec_path, folder / "maps", list(range(REALIZATIONS)))


def start_campaign(api: Api, spec: dict) -> tuple[int, int]:
    answer = api.post("/campaigns", json=spec)
    assert answer.status_code == 201, answer.text
    worker = api.register()
    api.build_plan(worker)
    return answer.json()["id"], worker


def deliver_next(api: Api, worker: int, folders: dict, count: int = 1) -> list[int]:
    delivered = []
    for task in api.claim(worker, max_tasks=count):
        answer = deliver(
            api.client, task, folders[task["realization"]], prefix=API_PREFIX, headers=auth(api.alice_worker)
        )
        assert answer.status_code == 200, answer.text
        delivered.append(task["realization"])
    return delivered


def summary_of(api: Api, campaign_id: int, token: str | None = None) -> dict:
    answer = api.get(f"/campaigns/{campaign_id}/products", token)
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_close_to_batch(running, values):
    values = np.asarray(values, dtype=np.float64)
    scale = np.sqrt(np.mean(values**2, axis=0))
    assert np.all(np.abs(np.asarray(running) - values.mean(axis=0)) <= 1e-12 * scale), "running mean != batch mean"


def assert_matches_stored_results(api: Api, campaign_id: int, folders: dict) -> dict:
    """The summary and the map downloads against numpy over every stored result and map at once."""
    summary = summary_of(api, campaign_id)
    stored = {}
    for index in range(REALIZATIONS):
        detail = api.get(f"/campaigns/{campaign_id}/realizations/{index}").json()
        if detail["state"] == "succeeded":
            stored[index] = detail["result"]["spectra"]
    assert summary["included"] == summary["succeeded"] == summary["spectra_realizations"] == len(stored)
    for name in SPECTRA:
        values = np.array([stored[index]["cl"][name] for index in sorted(stored)])
        assert_close_to_batch(summary["spectra"][name]["mean"], values)
        np.testing.assert_allclose(summary["spectra"][name]["std"], values.std(axis=0, ddof=1), rtol=1e-10)
        w2 = summary["mask"]["w2"]
        np.testing.assert_allclose(
            summary["noise_bias"]["spectra"][name]["value"], values.mean(axis=0) / w2, rtol=1e-10
        )

    maps = np.array([hp.read_map(folders[index] / "map_iqu.fits", field=(0, 1, 2)) for index in sorted(stored)])
    seen = maps[0, 0] != hp.UNSEEN
    mean = read_fits_download(api, f"/campaigns/{campaign_id}/products/mean-map", 3)
    variance = read_fits_download(api, f"/campaigns/{campaign_id}/products/variance-map", 3)
    assert np.all(mean[:, ~seen] == hp.UNSEEN) and np.all(variance[:, ~seen] == hp.UNSEEN)
    assert_close_to_batch(mean[:, seen], maps[:, :, seen])
    np.testing.assert_allclose(variance[:, seen], maps[:, :, seen].var(axis=0, ddof=1), rtol=1e-10)
    return summary


def read_fits_download(api: Api, path: str, fields: int, **params) -> np.ndarray:
    answer = api.get(path, params={"format": "fits", **params})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/fits"
    from astropy.io import fits

    with fits.open(io.BytesIO(answer.content)) as hdus:  # healpy.read_map takes a path or an HDUList
        return np.asarray(hp.read_map(hdus, field=tuple(range(fields)) if fields > 1 else 0))


# --------------------------------------------------------------------------- aggregates through the API


def test_running_aggregates_equal_the_stored_spectra_and_maps(api, mapped):
    spec, folders = mapped
    campaign_id, worker = start_campaign(api, spec)
    empty = summary_of(api, campaign_id)
    assert not empty["ready"] and empty["included"] == 0 and empty["downloads"]["spectra"] is None
    assert api.get(f"/campaigns/{campaign_id}/products/spectra").json()["code"] == "products_not_ready"

    deliver_next(api, worker, folders)
    one = summary_of(api, campaign_id)
    assert one["ready"] and one["spectra"]["TT"]["std"] is None and one["downloads"]["variance_map"] is None
    assert api.get(f"/campaigns/{campaign_id}/products/variance-map").status_code == 404

    deliver_next(api, worker, folders, count=3)
    summary = assert_matches_stored_results(api, campaign_id, folders)
    assert summary["kind"] == "noise-only" and summary["transfer_function"] is None
    assert summary["noise_bias"]["definition"].startswith("N_l = <C~_l> / w2")
    assert summary["bins"]["ell_min"] == [2, 10, 18, 26] and summary["bins"]["ell_max"] == [9, 17, 25, 32]
    assert summary["mask"]["stored"] and summary["mask"]["from_realization"] == 0 and not summary["warnings"]
    assert 0 < summary["mask"]["w2"] < summary["mask"]["fsky"] <= 1


def test_a_result_committed_before_a_crash_is_reconciled_at_start(make_api, database_url, mapped):
    """The service dies after the result's commit and before the hook: a new process adds it on start."""
    spec, folders = mapped
    first = make_api()
    campaign_id, worker = start_campaign(first, spec)
    deliver_next(first, worker, folders, count=2)
    remove_result_hook(update_after_result)  # as if killed right after the commit
    try:
        assert deliver_next(first, worker, folders) == [2]
    finally:
        on_result_accepted(update_after_result)
    lagging = summary_of(first, campaign_id)
    assert (lagging["succeeded"], lagging["included"]) == (3, 2)

    settings = Settings(
        data_dir=first.settings.data_dir, database_url=database_url, reaper_interval_s=3_600, auto_migrate=False
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:  # the restarted service
        second = Api(client, client.app, settings)
        wait_for(lambda: summary_of(second, campaign_id)["included"] >= 3, 60, "the reconciler to add the realisation")
        assert_matches_stored_results(second, campaign_id, folders)
        worker = second.register()  # the worker registers again with its token of this process
        deliver_next(second, worker, folders)  # and the hook goes on from there
        summary = assert_matches_stored_results(second, campaign_id, folders)
        assert summary["included"] == 4 and summary["generation"] == 4


def test_duplicate_reports_and_reconciling_again_change_nothing(api, mapped):
    spec, folders = mapped
    campaign_id, worker = start_campaign(api, spec)
    task = api.claim(worker)[0]
    assert deliver(api.client, task, folders[0], prefix=API_PREFIX, headers=auth(api.alice_worker)).status_code == 200
    before = summary_of(api, campaign_id)
    late = api.wpost(f"/tasks/{task['task_id']}/succeeded", json={"result": read_result(folders[0])})
    assert late.status_code == 409
    from service.products.reconcile import Reconciler, reconcile_campaign

    assert (
        reconcile_campaign(database=api.database, products_dir=api.settings.products_dir, campaign_id=campaign_id) == 0
    )
    assert Reconciler(api.database, api.settings).run_once() == 0
    assert summary_of(api, campaign_id) == before


# --------------------------------------------------------------------------- access and downloads


def test_products_are_the_owners_only(api, mapped):
    spec, folders = mapped
    campaign_id, worker = start_campaign(api, spec)
    deliver_next(api, worker, folders, count=2)
    base = f"/campaigns/{campaign_id}/products"
    paths = [
        base,
        f"{base}/spectra",
        f"{base}/mean-map",
        f"{base}/variance-map",
        f"{base}/mask",
        f"{base}/realizations/0/spectra",
        f"{base}/realizations/0/map",
        f"{base}/realizations/0/mask",
    ]
    for path in paths:
        assert api.get(path).status_code == 200, path
        answer = api.get(path, api.bob)
        assert answer.status_code == 404 and answer.json()["code"] == "campaign_not_found", path
        assert api.get(path, api.alice_worker).status_code == 403, path
        assert api.client.get(API_PREFIX + path).status_code == 401, path
    assert api.get(f"{base}/realizations/4/spectra").json()["code"] == "realization_products_not_found"
    assert api.get(f"{base}/elsewhere").status_code == 404
    assert api.get(f"{base}/spectra", params={"format": "xml"}).status_code == 422
    assert api.get(f"{base}/mean-map", params={"format": "json"}).status_code == 422


def test_downloads_parse(api, mapped):
    spec, folders = mapped
    campaign_id, worker = start_campaign(api, spec)
    deliver_next(api, worker, folders, count=2)
    base = f"/campaigns/{campaign_id}/products"
    summary = summary_of(api, campaign_id)

    as_json = api.get(f"{base}/spectra", params={"format": "json"})
    assert as_json.headers["content-type"].startswith("application/json")
    assert "attachment" in as_json.headers["content-disposition"]
    assert json.loads(as_json.content)["spectra"] == summary["spectra"]
    with np.load(io.BytesIO(api.get(f"{base}/spectra", params={"format": "npz"}).content)) as data:
        np.testing.assert_array_equal(data["TT_mean"], summary["spectra"]["TT"]["mean"])
        np.testing.assert_array_equal(data["nl_EE"], summary["noise_bias"]["spectra"]["EE"]["value"])
        assert data["ell_min"].tolist() == summary["bins"]["ell_min"] and float(data["w2"]) == summary["mask"]["w2"]
    from astropy.io import fits

    with fits.open(io.BytesIO(api.get(f"{base}/spectra", params={"format": "fits"}).content)) as hdus:
        table = hdus["SPECTRA"].data
        np.testing.assert_array_equal(table["BB_STD"], summary["spectra"]["BB"]["std"])
        assert hdus["SPECTRA"].header["N"] == 2

    mean = read_fits_download(api, f"{base}/mean-map", 3)
    with np.load(io.BytesIO(api.get(f"{base}/mean-map", params={"format": "npz"}).content)) as data:
        np.testing.assert_array_equal(data["mean"], mean)
        assert int(data["n"]) == 2
    mask = read_fits_download(api, f"{base}/mask", 1)
    np.testing.assert_array_equal(mask, hp.read_map(folders[0] / "mask.fits"))
    with np.load(io.BytesIO(api.get(f"{base}/mask", params={"format": "npz"}).content)) as data:
        np.testing.assert_array_equal(data["mask"], mask)

    one = api.get(f"{base}/realizations/1/spectra").json()
    assert one["spectra"] == read_result(folders[1])["spectra"]["cl"] and one["realization"] == 1
    with np.load(io.BytesIO(api.get(f"{base}/realizations/1/spectra", params={"format": "npz"}).content)) as data:
        np.testing.assert_array_equal(data["TT"], one["spectra"]["TT"])
    own_map = read_fits_download(api, f"{base}/realizations/1/map", 3)
    np.testing.assert_array_equal(own_map, hp.read_map(folders[1] / "map_iqu.fits", field=(0, 1, 2)))
    with np.load(io.BytesIO(api.get(f"{base}/realizations/1/map", params={"format": "npz"}).content)) as data:
        np.testing.assert_array_equal(data["iqu"], own_map)
    # Realisation 1 carries no mask (it comes with realisation 0 and the coupling): its mask is the campaign's.
    assert not (folders[1] / "mask.fits").exists()
    np.testing.assert_array_equal(read_fits_download(api, f"{base}/realizations/1/mask", 1), mask)
    with fits.open(folders[1] / "map_iqu.fits") as hdus:  # the cut-sky form, read back whole above
        assert hdus[1].header["INDXSCHM"] == "EXPLICIT" and hdus[1].data.size < hp.nside2npix(hdus[1].header["NSIDE"])


def test_openapi_describes_the_products(api):
    schema = api.client.get(f"{API_PREFIX}/openapi.json").json()
    paths = schema["paths"]
    summary = paths[f"{API_PREFIX}/campaigns/{{campaign_id}}/products"]["get"]
    assert summary["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ProductsSummary")
    assert (
        "application/fits"
        in paths[f"{API_PREFIX}/campaigns/{{campaign_id}}/products/mean-map"]["get"]["responses"]["200"]["content"]
    )
    assert {"ProductsSummary", "NoiseBias", "TransferFunction", "RealizationSpectra"} <= set(
        schema["components"]["schemas"]
    )


# --------------------------------------------------------------------------- dashboard


def login(api: Api, token: str) -> None:
    api.client.cookies.clear()
    answer = api.client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    assert answer.status_code == 303, answer.text


def test_dashboard_panel_shows_the_running_mean_and_the_spectra(api, mapped):
    spec, folders = mapped
    campaign_id, worker = start_campaign(api, spec)
    login(api, api.alice)
    assert "appear here once the campaign has products" in api.client.get(f"/campaigns/{campaign_id}").text
    deliver_next(api, worker, folders, count=2)
    page = api.client.get(f"/campaigns/{campaign_id}").text
    assert "appear here once the campaign has products" not in page
    assert f'src="/campaigns/{campaign_id}/products/mean-I.png?g=2"' in page
    assert 'data-chart="mc-spectra"' in page and 'data-chart="mc-noise-bias"' in page
    assert 'data-chart="mc-transfer"' not in page and "products.js" in page

    image = api.client.get(f"/campaigns/{campaign_id}/products/mean-Q.png?g=2")
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    chart = api.client.get(f"/ui/campaigns/{campaign_id}/products/spectra").json()
    assert chart["generation"] == 2 and chart["yScale"] == "log" and [s["label"] for s in chart["series"]] == ["TT", "EE", "BB"]
    summary = summary_of(api, campaign_id)
    np.testing.assert_allclose(chart["series"][0]["y"], np.array(summary["spectra"]["TT"]["mean"]) * 1e12, rtol=1e-12)
    bias = api.client.get(f"/ui/campaigns/{campaign_id}/products/noise-bias").json()
    assert len(bias["series"]) == 3 and all(len(s["lo"]) == 4 for s in bias["series"])
    assert api.client.get(f"/ui/campaigns/{campaign_id}/products/transfer").json()["series"] == []

    deliver_next(api, worker, folders)  # the next result moves the generation: new image URLs
    assert api.client.get(f"/ui/campaigns/{campaign_id}/products/spectra").json()["generation"] == 3
    assert "mean-I.png?g=3" in api.client.get(f"/campaigns/{campaign_id}").text

    login(api, api.bob)
    assert api.client.get(f"/campaigns/{campaign_id}/products/mean-I.png").status_code == 404
    assert api.client.get(f"/ui/campaigns/{campaign_id}/products/spectra").status_code == 404
    api.client.cookies.clear()
    assert api.client.get(f"/ui/campaigns/{campaign_id}/products/spectra").status_code == 401


# --------------------------------------------------------------------------- CLI against a live service


def run_products_cli(service, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {**service.env, "MAPCAMPAIGN_TOKEN": token or service.user_token}
    return subprocess.run(
        mapcampaign_command("products", *args), env=env, capture_output=True, check=False, text=True, timeout=120
    )


# The command is under test: the in-process tests above run its requests on both databases.
@on_database("postgresql")
def test_cli_downloads_the_products(live_service, mapped, tmp_path):
    import httpx

    spec, folders = mapped
    user = live_service.client(live_service.user_token)
    created = user.post("/campaigns", json=spec)
    assert created.status_code == 201, created.text
    campaign_id = created.json()["id"]

    nothing = run_products_cli(live_service, str(campaign_id), "--json")
    assert nothing.returncode == 1 and nothing.stdout == "" and "no Monte Carlo products yet" in nothing.stderr

    worker = live_service.client(live_service.worker_token)
    worker_id = worker.post("/workers", json={"name": "cli-test", "site": "local", "host": "h", "capacity": 4}).json()[
        "id"
    ]
    plan = worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 1}).json()["tasks"][0]
    built = {"path": "/p.h5", "checksum": "sha256:0", "size_bytes": 1, "build_time_s": 0.1}
    worker.post(f"/tasks/{plan['task_id']}/plan-built", json=built).raise_for_status()
    for task in worker.post(f"/workers/{worker_id}/claim", json={"max_tasks": 2}).json()["tasks"]:
        assert deliver(worker, task, folders[task["realization"]]).status_code == 200

    out = tmp_path / "fits"
    done = run_products_cli(live_service, str(campaign_id), "--json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["included"] == 2 and report["format"] == "fits"
    assert sorted(f["name"] for f in report["files"]) == [
        "bandpowers.fits",
        "mask.fits",
        "mean_map.fits",
        "spectra.fits",
        "variance_map.fits",
    ]
    mean = hp.read_map(out / "mean_map.fits", field=(0, 1, 2))
    maps = np.array([hp.read_map(folders[i] / "map_iqu.fits", field=(0, 1, 2)) for i in (0, 1)])
    seen = maps[0, 0] != hp.UNSEEN
    assert_close_to_batch(mean[:, seen], maps[:, :, seen])
    assert hp.read_map(out / "mask.fits").shape == (12 * 16**2,)

    done = run_products_cli(live_service, str(campaign_id), "--format", "npz", "--out", str(tmp_path / "npz"))
    assert done.returncode == 0, done.stderr
    assert "noise bias N_b (C_b, uK^2) over 2 realisation(s)" in done.stdout and "N_l" not in done.stdout
    with np.load(tmp_path / "npz" / "bandpowers.npz") as data:
        assert int(data["n"]) == 2 and data["noise_bias"].shape[0] == 6
    with np.load(tmp_path / "npz" / "spectra.npz") as data:
        assert data["TT_mean"].shape == (4,)
    done = run_products_cli(live_service, str(campaign_id), "-f", "json", "--json", "-o", str(tmp_path / "json"))
    assert done.returncode == 0
    assert [f["name"] for f in json.loads(done.stdout)["files"]] == ["bandpowers.json", "spectra.json"]
    assert json.loads((tmp_path / "json" / "spectra.json").read_text())["noise_bias"] is not None

    done = run_products_cli(live_service, str(campaign_id), "--realization", "1", "--json", "-o", str(tmp_path / "r1"))
    assert done.returncode == 0, done.stderr
    assert sorted(f["name"] for f in json.loads(done.stdout)["files"]) == [
        "r1_map_iqu.fits",
        "r1_mask.fits",
        "r1_spectra.fits",
    ]
    np.testing.assert_array_equal(hp.read_map(tmp_path / "r1" / "r1_map_iqu.fits", field=(0, 1, 2)), maps[1])

    assert run_products_cli(live_service, str(campaign_id), "--realization", "4").returncode == 1  # still queued
    assert run_products_cli(live_service, str(campaign_id), "--format", "xml").returncode == 2
    assert run_products_cli(live_service, str(campaign_id), "--realization", "-1").returncode == 2
    assert run_products_cli(live_service, "abc").returncode == 2
    bob = live_service.create_token("bob")
    other = run_products_cli(live_service, str(campaign_id), token=bob)
    assert other.returncode == 2 and "not found" in other.stderr and "mapcampaign list" in other.stderr
    assert run_products_cli(live_service, str(campaign_id), token=live_service.worker_token).returncode == 2
    (tmp_path / "file").write_text("")
    assert run_products_cli(live_service, str(campaign_id), "--out", str(tmp_path / "file")).returncode == 2
    user.close()
    worker.close()
    assert httpx.get(live_service.url + "/healthz").status_code == 200
