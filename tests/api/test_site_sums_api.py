"""Sites that keep their maps, on SQLite and PostgreSQL, with real map-maker outputs and the worker's own store.

One campaign's realisations are all uploaded; a second campaign of the same spec gets the same maps
from two sites (``a`` and ``b``) in keep mode: each site's :class:`worker.keep.SiteStore` moves the
maps into its store, the result names them, the accepted maps join the site's partial sums, and the
sums are sent to the service's endpoint. The merged mean and variance maps (a partial sky) must equal
the uploaded campaign's to round-off: ``rtol 1e-12`` on the mean and on the variance where two or
more realisations observed a pixel. Refused sums (wrong shape, pixel index, a realisation counted
twice, too large, no or a user's token) answer 4xx naming the reason and change nothing stored.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import healpy as hp
import numpy as np
import pytest

from campaignlib import sitesums, transport
from schemas.api import API_PREFIX
from schemas.result import RealizationResult
from service import keptfiles
from service.storage import CampaignProducts
from tests.api.conftest import Api
from tests.api.test_dashboard import login
from tests.support.mapped_campaign import deliver, map_realizations, spec_json, write_spec
from tests.support.service_helpers import auth
from tests.support.worker_helpers import wait_for
from worker.client import ServiceClient, ServiceError
from worker.keep import SiteStore

REALIZATIONS = 5
RTOL = 1e-12


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mapped")
    spec_path = write_spec(folder)
    return spec_json(spec_path), map_realizations(spec_path, folder / "maps", list(range(REALIZATIONS)))


def worker_client(api: Api) -> ServiceClient:
    """The worker's own HTTP client (``worker.client.ServiceClient``), its requests served by the in-process app."""
    client = ServiceClient("http://testserver/api/v1", api.alice_worker, retry_s=0)
    client._http = transport.http_client(
        "http://testserver/api/v1", api.alice_worker, timeout_s=30, transport=api.client._transport
    )
    return client


def _deliver_kept(api: Api, store: SiteStore, task: dict, source, work) -> None:
    """What the worker's report stage does at a keeping site: keep the maps, upload the rest, report, add."""
    folder = work / f"attempt-{task['task_id']}"
    shutil.copytree(source, folder)
    result = RealizationResult.model_validate_json((folder / "result.json").read_text())
    result = store.keep_maps(result, folder, task["campaign_id"])
    (folder / "result.json").write_text(result.model_dump_json())
    answer = deliver(api.client, task, folder, prefix=API_PREFIX, headers=auth(api.alice_worker))
    assert answer.status_code == 200, answer.text
    store.accepted(task["campaign_id"], result)


def _claim_realizations(api: Api, worker: int, count: int) -> list[dict]:
    tasks = []
    while len(tasks) < count:
        claimed = api.claim(worker, max_tasks=count - len(tasks))
        assert claimed, "nothing to claim"
        for task in claimed:
            if task["kind"] == "preprocess":
                assert api.plan_built(task["task_id"]).status_code == 200
            else:
                tasks.append(task)
    return tasks


def _download(api: Api, campaign_id: int, which: str) -> np.ndarray:
    answer = api.get(f"/campaigns/{campaign_id}/products/{which}", params={"format": "fits"})
    assert answer.status_code == 200, answer.text
    from astropy.io import fits

    with fits.open(io.BytesIO(answer.content)) as hdus:
        return np.asarray(hp.read_map(hdus, field=(0, 1, 2)))


@pytest.fixture
def two_sites(api: Api, mapped, tmp_path):
    """The uploaded campaign and the kept one (realisations 0-2 at site a, 3-4 at site b), sums not sent yet."""
    spec, folders = mapped
    spec = {**spec, "realizations": REALIZATIONS}
    uploaded = api.post("/campaigns", json=spec).json()["id"]
    worker = api.register("up", site="up")
    for task in _claim_realizations(api, worker, REALIZATIONS):
        answer = deliver(
            api.client, task, folders[task["realization"]], prefix=API_PREFIX, headers=auth(api.alice_worker)
        )
        assert answer.status_code == 200, answer.text
    kept = api.post("/campaigns", json=spec).json()["id"]
    sites = {}
    for site, count in (("a", 3), ("b", 2)):
        worker_id = api.register(f"w{site}", site=site)
        store = SiteStore(tmp_path / f"store-{site}", site, interval_s=3_600)
        store.worker_id = worker_id
        for task in _claim_realizations(api, worker_id, count):
            _deliver_kept(api, store, task, folders[task["realization"]], tmp_path / f"work-{site}")
        sites[site] = store
    return uploaded, kept, sites


def test_two_keeping_sites_give_the_mean_and_variance_of_the_uploaded_maps(api, two_sites):
    uploaded, kept, sites = two_sites
    summary = api.get(f"/campaigns/{kept}/products").json()
    assert summary["map_realizations"] == 0 and summary["included"] == REALIZATIONS  # spectra arrived, maps did not
    for store in sites.values():
        assert store.send(worker_client(api), kept)
        assert not store.send(worker_client(api), kept)  # within the interval: nothing sent
    assert api.get(f"/campaigns/{kept}/products").json()["map_realizations"] == REALIZATIONS
    mean, variance = _download(api, kept, "mean-map"), _download(api, kept, "variance-map")
    want_mean, want_variance = _download(api, uploaded, "mean-map"), _download(api, uploaded, "variance-map")
    seen = want_mean[0] != hp.UNSEEN
    assert 0 < seen.sum() < seen.size  # a partial sky
    np.testing.assert_array_equal(mean[:, ~seen], want_mean[:, ~seen])
    for got, want in ((mean, want_mean), (variance, want_variance)):
        for stokes in range(3):
            # Round-off against each map's own scale: a mean that nearly cancels (1e-10 among values of 1e-5)
            # differs by a few ulps of its terms, not of itself, between two orders of the same sums.
            scale = np.abs(want[stokes, seen]).max()
            np.testing.assert_allclose(got[stokes, seen], want[stokes, seen], rtol=RTOL, atol=RTOL * scale)


def _state(api: Api, campaign_id: int) -> bytes:
    return CampaignProducts(api.settings.products_dir, campaign_id).state_path.read_bytes()


def _send_file(api: Api, worker: int, campaign_id: int, path, token: str | None = None):
    return api.client.put(
        f"{API_PREFIX}/workers/{worker}/campaigns/{campaign_id}/map-sums",
        content=path.read_bytes(),
        headers={**(auth(token) if token else {}), "Content-Type": "application/octet-stream"},
    )


def _edited(store: SiteStore, campaign_id: int, tmp_path, **changes):
    sums = sitesums.read(store.campaign_dir(campaign_id) / "sums.npz")
    members = {"nside": sums.nside, "pixels": sums.pixels, "count": sums.count, "mean": sums.mean, "m2": sums.m2,
               "ledger": np.asarray(sums.ledger, np.int64), "format": 1}  # fmt: skip
    members.update(changes)
    path = tmp_path / "edited.npz"
    np.savez(path, **members)
    return path


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        (lambda s: {"mean": s.mean[:, :-1]}, 422, "mean"),
        (lambda s: {"pixels": np.concatenate([s.pixels[:-1], [12 * 16**2]])}, 422, "pixels"),
        (lambda s: {"ledger": np.array([[0, 5]], np.int64), "count": np.minimum(s.count, 5)}, 422, "ledger"),
        (lambda s: {"nside": 32}, 422, "nside"),
    ],
)
def test_hostile_sums_are_refused_naming_the_reason_and_change_nothing(api, two_sites, tmp_path, change, status, words):
    _, kept, sites = two_sites
    store = sites["a"]
    sums = sitesums.read(store.campaign_dir(kept) / "sums.npz")
    before = _state(api, kept)
    answer = _send_file(api, store.worker_id, kept, _edited(store, kept, tmp_path, **change(sums)), api.alice_worker)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["detail"]
    assert _state(api, kept) == before


def test_sums_without_a_worker_token_or_too_large_are_refused_before_reading(api, make_api, two_sites):
    _, kept, sites = two_sites
    path = sites["a"].campaign_dir(kept) / "sums.npz"
    before = _state(api, kept)
    assert _send_file(api, sites["a"].worker_id, kept, path).status_code == 401
    assert _send_file(api, sites["a"].worker_id, kept, path, api.alice).status_code == 403
    assert _send_file(api, sites["a"].worker_id, kept, path, api.bob_worker).status_code in (403, 409)
    assert _state(api, kept) == before


def test_a_body_over_the_artifact_limit_is_refused(make_api, tmp_path):
    small = make_api(max_artifact_bytes=1_024)
    worker = small.register("wa", site="a")
    campaign = small.create()["id"]
    path = tmp_path / "big.npz"
    path.write_bytes(b"\0" * 4_096)
    answer = _send_file(small, worker, campaign, path, small.alice_worker)
    assert answer.status_code == 413, answer.text


def test_a_kept_map_is_served_from_the_site_store_with_its_checksum_verified(api, two_sites, mapped):
    _, kept, sites = two_sites
    _, folders = mapped
    detail = api.realization(kept, 0)
    (iqu,) = [p for p in detail["result"]["products"] if p["name"] == "iqu"]
    assert iqu["kept"]["site"] in sites
    path = f"/campaigns/{kept}/products/realizations/0/map"
    answer = api.get(path, params={"format": "fits"})
    assert answer.status_code == 200, answer.text
    assert answer.content == (folders[0] / "map_iqu.fits").read_bytes()
    assert api.get(path, params={"format": "npz"}).status_code == 200
    login(api)  # the dashboard's realisation page: its quick-look images and the file itself
    page = api.client.get(f"/campaigns/{kept}/realizations/0").text
    image = f"/campaigns/{kept}/realizations/0/maps/I.png"
    assert image in page
    drawn = api.client.get(image)
    assert drawn.status_code == 200 and drawn.content.startswith(b"\x89PNG")
    file = api.client.get(f"/campaigns/{kept}/realizations/0/products/{iqu['path']}")
    assert file.status_code == 200 and file.content == answer.content

    stored = Path(iqu["kept"]["path"])
    damaged = bytearray(stored.read_bytes())
    damaged[-1] ^= 0xFF  # same size, other bytes
    stored.write_bytes(bytes(damaged))
    answer = api.get(path, params={"format": "fits"})
    assert answer.status_code == 404 and answer.json()["code"] == "kept_file_unavailable"
    assert "SHA-256" in answer.json()["detail"]
    stored.unlink()  # gone: the site's worker is asked, and says so
    assert api.get(path, params={"format": "fits"}).status_code == 202
    store = sites[iqu["kept"]["site"]]
    (request,) = worker_client(api).kept_file_requests(store.worker_id).requests
    assert not store.serve_fetch(worker_client(api), request)
    answer = api.get(path, params={"format": "fits"})
    assert answer.status_code == 404 and "missing at the site" in answer.json()["detail"]


def _kept_iqu(api: Api, campaign_id: int, index: int) -> dict:
    (iqu,) = [p for p in api.realization(campaign_id, index)["result"]["products"] if p["name"] == "iqu"]
    return iqu


def test_a_map_the_service_cannot_read_is_fetched_through_its_sites_worker(api, two_sites, mapped, monkeypatch):
    _, kept, sites = two_sites
    _, folders = mapped
    monkeypatch.setattr(keptfiles, "readable_here", lambda path: False)  # the service on another host than the sites
    client = worker_client(api)
    site = _kept_iqu(api, kept, 0)["kept"]["site"]
    store, other = sites[site], sites[{"a": "b", "b": "a"}[site]]
    path = f"/campaigns/{kept}/products/realizations/0/map"
    answer = api.get(path, params={"format": "fits"})
    assert answer.status_code == 202 and answer.json()["code"] == "kept_file_pending", answer.text
    assert answer.headers["Retry-After"] == str(keptfiles.FETCH_RETRY_AFTER_S)
    assert client.kept_file_requests(other.worker_id).requests == []  # another site is not asked
    login(api)
    assert 'data-state="pending"' in api.client.get(f"/campaigns/{kept}/realizations/0").text
    (request,) = client.kept_file_requests(store.worker_id).requests
    assert (request.campaign_id, request.realization, request.role) == (kept, 0, "iqu")
    assert store.serve_fetch(client, request)
    answer = api.get(path, params={"format": "fits"})
    assert answer.status_code == 200 and answer.content == (folders[0] / "map_iqu.fits").read_bytes()
    assert client.kept_file_requests(store.worker_id).requests == []
    page = api.client.get(f"/campaigns/{kept}/realizations/0").text
    assert 'data-state="ready"' in page and f"/campaigns/{kept}/realizations/0/maps/I.png" in page
    assert api.client.get(f"/campaigns/{kept}/realizations/0/maps/I.png").status_code == 200

    # Damaged at the site: the worker says so, and the download is a 404 naming why, for good.
    index = next(i for i in range(1, REALIZATIONS) if _kept_iqu(api, kept, i)["kept"]["site"] == site)
    stored = Path(_kept_iqu(api, kept, index)["kept"]["path"])
    stored.write_bytes(stored.read_bytes()[:-1] + b"x")
    path = f"/campaigns/{kept}/products/realizations/{index}/map"
    assert api.get(path, params={"format": "fits"}).status_code == 202
    (request,) = client.kept_file_requests(store.worker_id).requests
    assert not store.serve_fetch(client, request)
    for _ in range(2):
        answer = api.get(path, params={"format": "fits"})
        assert answer.status_code == 404 and "damaged" in answer.json()["detail"], answer.text
    page = api.client.get(f"/campaigns/{kept}/realizations/{index}").text
    assert 'data-state="failed"' in page and "damaged" in page


def test_a_fetched_file_of_other_bytes_is_refused(api, two_sites, monkeypatch, tmp_path):
    _, kept, sites = two_sites
    monkeypatch.setattr(keptfiles, "readable_here", lambda path: False)
    client = worker_client(api)
    store = sites[_kept_iqu(api, kept, 0)["kept"]["site"]]
    path = f"/campaigns/{kept}/products/realizations/0/map"
    assert api.get(path, params={"format": "fits"}).status_code == 202
    (request,) = client.kept_file_requests(store.worker_id).requests
    wrong = tmp_path / "wrong.fits"
    wrong.write_bytes(b"\0" * request.size_bytes)  # the right size, other bytes: a worker that did not check
    with pytest.raises(ServiceError) as refused:
        client.send_kept_file(store.worker_id, request, wrong)
    assert refused.value.status == 422 and "SHA-256" in str(refused.value)
    answer = api.get(path, params={"format": "fits"})
    assert answer.status_code == 404 and "damaged at the site" in answer.json()["detail"]


def test_the_client_waits_on_202_until_the_worker_sent_the_map(api, two_sites, mapped, monkeypatch):
    import threading

    from mapcampaign import Client

    _, kept, sites = two_sites
    _, folders = mapped
    monkeypatch.setattr(keptfiles, "readable_here", lambda path: False)
    monkeypatch.setattr(keptfiles, "FETCH_RETRY_AFTER_S", 1)
    store = sites[_kept_iqu(api, kept, 1)["kept"]["site"]]
    worker = worker_client(api)

    def site_worker() -> None:  # what the worker's loop does once the request is listed
        listed = wait_for(lambda: worker.kept_file_requests(store.worker_id).requests, 60, "a fetch request")
        store.serve_fetch(worker, listed[0])

    helper = threading.Thread(target=site_worker)
    helper.start()
    user = Client("http://testserver", api.alice, transport=api.client._transport)
    iqu = user.realization_map(kept, 1, wait_s=60)
    helper.join(timeout=60)
    np.testing.assert_array_equal(iqu, hp.read_map(folders[1] / "map_iqu.fits", field=(0, 1, 2), dtype=np.float64))
