"""``mapcampaign.Client``, every method, against a live service on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json

import healpy as hp
import numpy as np
import pytest
from astropy.io import fits

import mapcampaign
from mapcampaign._events import CampaignEvents
from mapcampaign.errors import (
    ApiError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    Unauthorized,
    WaitTimeout,
)
from schemas.api import CampaignDetail, CampaignSummary, PlanInfo, RealizationDetail
from schemas.spec import CampaignSpec
from tests.client.conftest import ELL_MAX, ELL_MIN, CampaignRunner, small_spec
from tests.support.fake_worker import iqu_map_fits
from tests.support.live_service import LiveService, mapcampaign_command

UNKNOWN = 987_654


def read_iqu(fits_bytes: bytes) -> np.ndarray:
    with fits.open(io.BytesIO(fits_bytes)) as hdus:
        return np.asarray(hp.read_map(hdus, field=(0, 1, 2), dtype=np.float64))


def test_submit_a_dict_a_file_and_a_model_then_get_and_list_them(client: mapcampaign.Client, tmp_path):
    spec_file = tmp_path / "campaign.json"
    spec_file.write_text(json.dumps(small_spec("listed-file")))
    submitted = [
        client.submit(small_spec("listed-dict")),
        client.submit(spec_file),
        client.submit(str(spec_file)),
        client.submit(CampaignSpec.model_validate(small_spec("listed-model"))),
    ]
    assert all(isinstance(campaign, CampaignDetail) for campaign in submitted)
    assert [campaign.spec.name for campaign in submitted] == ["listed-dict", "listed-file", "listed-file", "listed-model"]
    assert all(campaign.state == "queued" and campaign.realizations == 2 for campaign in submitted)

    fetched = client.get(submitted[1].id)
    assert (fetched.id, fetched.spec, fetched.progress.counts["queued"]) == (submitted[1].id, submitted[1].spec, 2)

    listed = client.list(name="listed-")
    assert all(isinstance(campaign, CampaignSummary) for campaign in listed)
    assert {campaign.id for campaign in listed} == {campaign.id for campaign in submitted}
    assert len(client.list(name="listed-", limit=3)) == 3
    assert [campaign.id for campaign in client.list(name="listed-model", state="queued")] == [submitted[3].id]
    assert client.list(name="listed-", state="succeeded") == []


def test_an_idempotency_key_makes_one_campaign_of_two_submits(client: mapcampaign.Client):
    first = client.submit(small_spec("keyed"), idempotency_key="client-test-key-1")
    again = client.submit(small_spec("keyed"), idempotency_key="client-test-key-1")
    assert again.id == first.id
    assert len(client.list(name="keyed")) == 1


def test_a_spec_file_is_its_own_key_from_the_client_and_the_command_line(
    client: mapcampaign.Client, live_service: LiveService, tmp_path
):
    """The same file submitted by ``mapcampaign submit`` and then by ``Client.submit`` is one campaign;
    ``new=True`` makes another. A file that is not there is FileNotFoundError, and the counts print as words."""
    import subprocess

    path = tmp_path / "keyed-file.json"
    path.write_text(json.dumps(small_spec("keyed-file")))
    env = {**live_service.env, "MAPCAMPAIGN_SERVER": live_service.url, "MAPCAMPAIGN_TOKEN": live_service.user_token}
    done = subprocess.run(
        mapcampaign_command("submit", str(path), "--json"), env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    again = client.submit(path)
    assert [campaign.id for campaign in client.list(name="keyed-file")] == [again.id]
    assert client.submit(path, new=True).id != again.id
    with pytest.raises(FileNotFoundError):
        client.submit(tmp_path / "absent.toml")
    assert "'queued': 2" in str(again.progress.counts) and "RealizationState" not in str(again.progress.counts)


def test_a_bad_spec_is_refused_before_it_is_sent_with_the_field_path(client: mapcampaign.Client, tmp_path):
    before = len(client.list())
    with pytest.raises(InvalidRequest) as refused:
        client.submit(small_spec("bad-nside", **{"pixelization.nside": 33}))
    assert [field for field, _ in refused.value.problems] == ["pixelization.nside"]
    assert "power of two" in refused.value.problems[0][1]
    assert "pixelization.nside" in str(refused.value)

    with pytest.raises(InvalidRequest) as misspelt:
        client.submit({**small_spec("typo"), "realisations": 3})
    assert misspelt.value.problems == [("realisations", "unknown field; did you mean 'realizations'?")]

    bad_file = tmp_path / "bad.toml"
    bad_file.write_text("name = [unclosed\n")
    with pytest.raises(InvalidRequest) as unreadable:
        client.submit(bad_file)
    assert unreadable.value.problems[0][0] == "" and "not valid TOML" in unreadable.value.problems[0][1]
    assert len(client.list()) == before  # nothing reached the service


def test_the_service_s_own_422_carries_the_field_path(client: mapcampaign.Client):
    with pytest.raises(InvalidRequest) as refused:
        client.plans(scan_key="x" * 65)
    assert refused.value.status == 422
    assert [field for field, _ in refused.value.problems] == ["query.scan_key"]


def test_an_unknown_campaign_is_not_found_by_every_method(client: mapcampaign.Client, tmp_path):
    calls = {
        "get": lambda: client.get(UNKNOWN),
        "cancel": lambda: client.cancel(UNKNOWN),
        "retry": lambda: client.retry(UNKNOWN),
        "delete": lambda: client.delete(UNKNOWN),
        "logs": lambda: client.logs(UNKNOWN),
        "realization": lambda: client.realization(UNKNOWN, 0),
        "realization_map": lambda: client.realization_map(UNKNOWN, 0),
        "products": lambda: client.products(UNKNOWN),
        "download_products": lambda: client.download_products(UNKNOWN, tmp_path),
        "watch": lambda: next(client.watch(UNKNOWN)),
        "wait": lambda: client.wait(UNKNOWN, timeout=5),
    }
    for method, call in calls.items():
        with pytest.raises(NotFound) as missing:
            call()
        assert missing.value.status == 404 and missing.value.code.endswith("not_found"), method


def test_a_bad_token_is_unauthorized_and_a_worker_token_forbidden(live_service: LiveService):
    with mapcampaign.Client(server=live_service.url, token="not-a-token") as stranger, pytest.raises(Unauthorized) as refused:
        stranger.list()
    assert refused.value.status == 401
    with mapcampaign.Client(server=live_service.url, token=live_service.worker_token) as worker, pytest.raises(Forbidden) as forbidden:
        worker.get(1)
    assert forbidden.value.status == 403


def test_wait_on_a_campaign_nothing_runs_times_out(client: mapcampaign.Client):
    campaign = client.submit(small_spec("never-run"))
    with pytest.raises(WaitTimeout) as timed_out:
        client.wait(campaign.id, timeout=0.5, poll_s=0.1)
    assert isinstance(timed_out.value, TimeoutError)
    assert (timed_out.value.campaign_id, timed_out.value.last.state) == (campaign.id, "queued")


def test_watch_reports_each_change_and_ends_with_the_finished_campaign(
    client: mapcampaign.Client, campaign_runner: CampaignRunner
):
    campaign = client.submit(small_spec("watched"))
    seen = []
    for detail in client.watch(campaign.id):
        seen.append((str(detail.state), detail.progress.counts["succeeded"]))
        if detail.state == "queued" or detail.state == "running":
            campaign_runner.run_one()  # the next snapshot differs: one more realisation succeeded
    assert seen[0] == ("queued", 0)
    assert seen[-1] == ("succeeded", 2)
    assert [succeeded for _, succeeded in seen] == [0, 1, 2]
    assert client.wait(campaign.id, timeout=30).state == "succeeded"  # a finished campaign returns at once


def test_the_event_stream_wakes_the_watcher_on_a_change(client: mapcampaign.Client, live_service: LiveService):
    campaign = client.submit(small_spec("streamed"))
    with live_service.client(live_service.user_token) as http, CampaignEvents(http, campaign.id) as events:
        assert events.wait(timeout=30) and events.connected.is_set()
        client.cancel(campaign.id)
        assert events.wait(timeout=30)  # the cancellation's event, not a timeout
        assert events.connected.is_set()


def test_logs_retry_cancel_and_delete(client: mapcampaign.Client, campaign_runner: CampaignRunner):
    campaign = client.submit(small_spec("troubled"))
    failed_task = campaign_runner.run_one(fail=True)
    succeeded_task = campaign_runner.run_one()
    assert client.get(campaign.id).state == "failed"

    logs = client.logs(campaign.id)
    assert all(isinstance(detail, RealizationDetail) for detail in logs)
    assert [detail.index for detail in logs] == [failed_task["realization"]]
    [attempt] = logs[0].attempt_history
    assert (attempt.failure_class, attempt.exit_code) == ("app_error", 1) and "boom" in (attempt.log_tail or "")
    [one] = client.logs(campaign.id, realization=succeeded_task["realization"])
    assert one.state == "succeeded" and one.result is not None
    with pytest.raises(NotFound) as no_such_realization:
        client.logs(campaign.id, realization=5)
    assert no_such_realization.value.code == "realization_not_found"

    retried = client.retry(campaign.id)
    assert retried.requeued == 1 and retried.campaign.state in ("queued", "running")
    with pytest.raises(Conflict):
        client.delete(campaign.id)  # not finished
    cancelled = client.cancel(campaign.id, reason="enough of it")
    assert (cancelled.state, cancelled.cancel_reason) == ("cancelled", "enough of it")
    with pytest.raises(Conflict) as again:
        client.cancel(campaign.id)
    assert again.value.status == 409 and isinstance(again.value, ApiError)

    client.delete(campaign.id)
    with pytest.raises(NotFound):
        client.get(campaign.id)


def test_maps_products_plans_and_downloads(client: mapcampaign.Client, campaign_runner: CampaignRunner, tmp_path):
    campaign = client.submit(small_spec("mapped"))
    for _ in range(2):
        campaign_runner.run_one(with_map=True, with_spectra=True)
    assert client.wait(campaign.id, timeout=60).state == "succeeded"

    realization = client.realization(campaign.id, 1)
    assert (realization.index, realization.state, realization.campaign_id) == (1, "succeeded", campaign.id)
    uploaded = [read_iqu(iqu_map_fits(seed=index)) for index in (0, 1)]
    for index in (0, 1):
        iqu = client.realization_map(campaign.id, index)
        assert iqu.shape == (3, hp.nside2npix(16)) and iqu.dtype == np.float64
        np.testing.assert_array_equal(iqu, uploaded[index])

    products = client.products(campaign.id)
    assert (products.summary.succeeded, products.summary.spectra_realizations) == (2, 2)
    np.testing.assert_array_equal(products.ell_min, ELL_MIN)
    np.testing.assert_array_equal(products.ell_max, ELL_MAX)
    bins = np.arange(1, len(ELL_MIN) + 1)
    np.testing.assert_allclose(products.spectra_mean["TT"], 1.5e-12 * bins, rtol=1e-12)  # mean of 1x and 2x
    np.testing.assert_allclose(products.spectra_std["EE"], np.sqrt(0.5) * 1e-12 * bins, rtol=1e-9)
    assert products.noise_bias == {} and products.transfer_function == {}  # a signal+noise campaign has neither

    saved = client.download_products(campaign.id, tmp_path / "products")
    assert {"spectra", "mean_map", "variance_map"} <= set(saved)
    assert saved["mean_map"] == tmp_path / "products" / "mean_map.fits"  # the names `mapcampaign products` gives
    assert all(path.is_file() and path.stat().st_size > 0 for path in saved.values())
    mean_map = np.asarray(hp.read_map(str(saved["mean_map"]), field=(0, 1, 2), dtype=np.float64))
    observed = uploaded[0][0] != hp.UNSEEN
    np.testing.assert_allclose(mean_map[:, observed], (uploaded[0][:, observed] + uploaded[1][:, observed]) / 2)

    plans = client.plans(scan_key=campaign.scan_key)
    assert [plan.state for plan in plans] == ["ready"] and all(isinstance(plan, PlanInfo) for plan in plans)
    assert plans[0].ranks == campaign.ranks
    assert client.plans(scan_key=campaign.scan_key, state="building") == []
    assert plans[0].id in {plan.id for plan in client.plans()}
