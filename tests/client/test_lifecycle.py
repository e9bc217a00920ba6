"""Extending and cloning campaigns through the client, against a live service on SQLite and PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest

import mapcampaign
from mapcampaign.client import changes_from_assignments
from mapcampaign.errors import Conflict, InvalidRequest, NotFound
from schemas.spec import MAX_REALIZATIONS
from tests.client.conftest import ELL_MIN, CampaignRunner, small_spec


def test_an_extended_campaign_runs_new_indices_into_the_same_aggregates_and_plan(
    client: mapcampaign.Client, campaign_runner: CampaignRunner
):
    campaign = client.submit(small_spec("extended"))
    first = [campaign_runner.run_one(with_spectra=True) for _ in range(2)]
    assert client.wait(campaign.id, timeout=60).state == "succeeded"
    [plan] = client.plans(scan_key=campaign.scan_key)

    extended = client.extend(campaign.id, 2)
    assert (extended.realizations, extended.spec.realizations) == (4, 4)
    assert extended.state in ("queued", "running") and extended.finished_at is None
    assert extended.spec_hash == campaign.spec_hash  # one spec before and after: the count is not in the hash

    # Straight to realisations: the plan built for the first two serves the new ones.
    later = []
    for _ in range(2):
        task = campaign_runner.worker.claim_one()
        assert task["kind"] == "realize" and task["spec"]["realizations"] == 4
        campaign_runner.worker.start(task)
        campaign_runner.succeed(task, with_spectra=True)
        later.append(task)
    indices = [task["realization"] for task in first + later]
    assert sorted(indices) == [0, 1, 2, 3]  # new indices, hence new seeds (every stream is keyed by the index)
    assert client.wait(campaign.id, timeout=60).state == "succeeded"
    assert [p.id for p in client.plans(scan_key=campaign.scan_key)] == [plan.id]

    products = client.products(campaign.id)
    assert (products.summary.succeeded, products.summary.spectra_realizations) == (4, 4)
    bins = np.arange(1, len(ELL_MIN) + 1)
    np.testing.assert_allclose(products.spectra_mean["TT"], 2.5e-12 * bins, rtol=1e-12)  # mean of 1x .. 4x


def test_extend_is_refused_for_a_cancelled_a_deleted_or_an_oversized_campaign(client: mapcampaign.Client):
    campaign = client.submit(small_spec("not-extended"))
    with pytest.raises(InvalidRequest) as too_many:
        client.extend(campaign.id, MAX_REALIZATIONS)
    assert too_many.value.status == 422 and [field for field, _ in too_many.value.problems] == ["realizations"]
    with pytest.raises(InvalidRequest) as zero:
        client.extend(campaign.id, 0)
    assert [field for field, _ in zero.value.problems] == ["realizations"]
    assert client.get(campaign.id).realizations == 2  # nothing stored changed

    client.cancel(campaign.id)
    with pytest.raises(Conflict) as cancelled:
        client.extend(campaign.id, 1)
    assert "clone" in str(cancelled.value)
    client.delete(campaign.id)
    with pytest.raises(NotFound):
        client.extend(campaign.id, 1)


def test_a_clone_shares_the_plan_when_its_scan_is_the_same_and_not_otherwise(
    client: mapcampaign.Client, campaign_runner: CampaignRunner
):
    original = client.submit(small_spec("original", realizations=1))
    campaign_runner.run_one()
    assert client.wait(original.id, timeout=60).state == "succeeded"

    same_scan = client.clone(original.id, {"name": "same scan", "max_attempts": 2})
    assert same_scan.id != original.id and same_scan.name == "same scan"
    assert (same_scan.scan_key, same_scan.max_attempts, same_scan.realizations) == (original.scan_key, 2, 1)
    expected = original.spec.model_dump() | {"name": "same scan", "max_attempts": 2}
    assert same_scan.spec.model_dump() == expected
    task = campaign_runner.worker.claim_one()
    assert (task["kind"], task["campaign_id"]) == ("realize", same_scan.id)  # no second plan build
    campaign_runner.worker.start(task)
    campaign_runner.succeed(task)

    nside = 2 * original.spec.pixelization.nside
    finer = client.clone(original.id, changes_from_assignments([f"pixelization.nside={nside}", "name=finer"]))
    assert finer.spec.pixelization.nside == nside and finer.scan_key != original.scan_key
    assert finer.spec.scan == original.spec.scan  # tables merge key by key
    assert campaign_runner.worker.claim_one()["kind"] == "preprocess"  # a new scan key needs its own plan
    assert client.get(original.id).spec == original.spec  # the original is untouched


def test_a_clone_s_bad_change_names_its_field_and_stores_nothing(client: mapcampaign.Client):
    original = client.submit(small_spec("clone source"))
    before = len(client.list())
    with pytest.raises(InvalidRequest) as boolean:
        client.clone(original.id, {"pixelization": {"nside": True}})
    assert boolean.value.status == 422
    assert [field for field, _ in boolean.value.problems] == ["changes.pixelization.nside"]
    with pytest.raises(InvalidRequest) as typo:
        client.clone(original.id, {"pixelisation": {"nside": 32}})
    [(field, message)] = typo.value.problems
    assert field == "changes.pixelisation" and "did you mean 'pixelization'" in message
    with pytest.raises(NotFound):
        client.clone(987_654, {})
    assert len(client.list()) == before


def test_assignments_become_nested_changes():
    assert changes_from_assignments(["a.b=3", "a.c=true", "name=x y", 'd=[1, "2"]']) == {
        "a": {"b": 3, "c": True},
        "name": "x y",
        "d": [1, "2"],
    }
    for bad in ("novalue", "=3", "a..b=1"):
        with pytest.raises(ValueError, match="FIELD.PATH=VALUE"):
            changes_from_assignments([bad])
