"""A sky map no site declares is refused at submit (422 naming ``sky.path``), on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest

import mapcampaign
from mapcampaign.errors import InvalidRequest
from tests.client.conftest import small_spec
from tests.support.live_service import LiveService


def register(live_service: LiveService, name: str, site: str, sky_maps: list[str] | None) -> None:
    body = {"name": name, "site": site, "host": "node1", "capacity": 1, "sky_maps": sky_maps}
    answer = httpx.post(
        f"{live_service.api_url}/workers",
        json=body,
        headers={"Authorization": f"Bearer {live_service.worker_token}"},
        timeout=30,
    )
    answer.raise_for_status()


def refused_field(client: mapcampaign.Client, spec: dict) -> tuple[str, str]:
    with pytest.raises(InvalidRequest) as refused:
        client.submit(spec)
    assert refused.value.status == 422
    [problem] = refused.value.problems
    return problem


def test_a_sky_map_is_checked_against_the_maps_the_sites_declare(client: mapcampaign.Client, live_service: LiveService):
    before = len(client.list())
    on_map = small_spec("own sky", sky={"kind": "map", "path": "dust/353.fits"})
    field, reason = refused_field(client, on_map)
    assert field == "sky.path" and "no site declares a sky_root" in reason

    register(live_service, "sky-less", "bare", None)  # a site without a sky_root declares nothing
    register(live_service, "skyful", "cluster", ["cmb.fits", "dust/353.fits"])
    created = client.submit(on_map)
    assert created.spec.sky.path == "dust/353.fits"

    field, reason = refused_field(client, small_spec("typo", sky={"kind": "map", "path": "dust/354.fits"}))
    assert field == "sky.path" and "no file 'dust/354.fits' under the sky_root of any site (cluster)" in reason
    outside = httpx.post(
        f"{live_service.api_url}/campaigns",
        json=small_spec("outside", sky={"kind": "map", "path": "../etc/x.fits"}),
        headers={"Authorization": f"Bearer {live_service.user_token}"},
        timeout=30,
    )
    assert outside.status_code == 422  # the spec's own check: nothing leaves the root
    assert [(item["field"], ".." in item["msg"]) for item in outside.json()["detail"]] == [("body.sky.path", True)]

    with pytest.raises(InvalidRequest) as cloned:
        client.clone(created.id, {"sky": {"path": "gone.fits"}})
    assert [field for field, _ in cloned.value.problems] == ["changes.sky.path"]
    assert len(client.list()) == before + 1  # only the campaign that passed was stored

    register(live_service, "skyful", "cluster", ["cmb.fits"])  # registering again replaces the list
    field, _ = refused_field(client, on_map)
    assert field == "sky.path"
    register(live_service, "skyful", "cluster", None)
