"""``POST /spectrum`` checks its media type and the caller's limit of running spectra before it reads the map:
one user over the limit gets 429 with Retry-After, another user and every other request go on."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from service.products import spectrum
from service.products.service import ProductsNotReady

FITS = {"Content-Type": "application/fits"}
CAMPAIGNS = {"transfer": 1, "noise": 2}


class HeldLookups:
    """Stands in for the campaigns' lookup (the first step inside a request's slot): each call waits until
    :attr:`release` is set, so a request stays running for as long as the test says."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.owners: list[int] = []

    def __call__(self, *, owner_id: int, **_campaigns) -> dict:
        self.owners.append(owner_id)
        self.entered.release()
        if not self.release.wait(timeout=60):
            raise TimeoutError("the test never released the held lookup")
        raise ProductsNotReady("held by the test")

    def wait_entered(self) -> None:
        assert self.entered.acquire(timeout=30), "a spectrum request never reached its lookup"


@pytest.fixture
def held(monkeypatch) -> HeldLookups:
    lookups = HeldLookups()
    monkeypatch.setattr(spectrum, "resolve_campaigns", lookups)
    return lookups


def test_one_user_over_the_limit_gets_429_another_user_and_status_reads_go_on(make_api, held):
    api = make_api(spectrum_per_user=1)
    campaign = api.create()
    with ThreadPoolExecutor(max_workers=2) as pool:
        alice_first = pool.submit(api.post, "/spectrum", api.alice, params=CAMPAIGNS, content=b"SIMPLE  =", headers=FITS)
        held.wait_entered()
        refused = api.post("/spectrum", api.alice, params=CAMPAIGNS, content=b"SIMPLE  =", headers=FITS)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) > 0
        assert "MAPCAMPAIGN_SPECTRUM_PER_USER" in refused.json()["detail"]
        bob = pool.submit(api.post, "/spectrum", api.bob, params=CAMPAIGNS, content=b"SIMPLE  =", headers=FITS)
        held.wait_entered()  # bob's request runs beside alice's
        # Both spectra are running: a status read is not held up by them.
        assert api.get(f"/campaigns/{campaign['id']}").status_code == 200
        held.release.set()
        assert alice_first.result(timeout=60).status_code == 404
        assert bob.result(timeout=60).status_code == 404
    assert len(held.owners) == 2 and len(set(held.owners)) == 2
    # Her slot is free again.
    assert api.post("/spectrum", api.alice, params=CAMPAIGNS, content=b"SIMPLE  =", headers=FITS).status_code == 404


def test_the_media_type_is_checked_before_the_limit_and_the_body(make_api, held):
    api = make_api()
    held.release.set()
    for media_type in ("application/json", "text/plain", None):
        headers = {"Content-Type": media_type} if media_type else {}
        answer = api.post("/spectrum", params=CAMPAIGNS, content=b"SIMPLE  =", headers=headers)
        assert answer.status_code == 415 and "application/fits" in answer.json()["detail"], answer.text
    assert held.owners == []  # refused before the campaigns were looked up


def test_the_map_is_streamed_to_a_file_and_the_program_runs_with_no_connection_held(make_api, monkeypatch):
    """While the map-maker's program runs, the request holds no database connection; its map is on disk,
    byte for byte, and removed afterwards."""
    from service.errors import InvalidField

    api = make_api()
    seen: dict = {}

    def roles(**_campaigns) -> dict:
        return {"transfer": "the transfer campaign"}

    async def program(transfer, map_file, *, coupling_dir):
        seen["map"] = map_file.read_bytes()
        seen["connections"] = api.database.engine.pool.checkedout()
        seen["coupling_dir"] = coupling_dir
        raise InvalidField(("body",), "stopped by the test")

    monkeypatch.setattr(spectrum, "resolve_campaigns", roles)
    monkeypatch.setattr(spectrum, "map_bandpowers", program)
    body = b"SIMPLE  =" + bytes(range(256)) * 64
    answer = api.post("/spectrum", params=CAMPAIGNS, content=body, headers=FITS)
    assert answer.status_code == 422 and "stopped by the test" in answer.text
    assert seen["map"] == body and seen["connections"] == 0
    assert seen["coupling_dir"] == api.settings.coupling_cache_dir
    assert list(api.settings.spectrum_work_dir.iterdir()) == []
