"""The client's errors and paging, against answers made up in the test (httpx.MockTransport): no service runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import numpy as np
import pytest

import mapcampaign
from mapcampaign.errors import (
    ApiError,
    Conflict,
    Forbidden,
    InvalidRequest,
    MapCampaignError,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
    WaitTimeout,
    api_error,
)
from mapcampaign.products import Products
from schemas.products import ProductDownloads, ProductsSummary
from tests.support.service_helpers import spec_data


def client_answering(handler) -> mapcampaign.Client:
    return mapcampaign.Client(server="http://service.test", token="t", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("status", "error_class"),
    [(401, Unauthorized), (403, Forbidden), (404, NotFound), (409, Conflict), (503, ServiceUnavailable), (500, ApiError)],
)
def test_each_status_has_its_exception(status, error_class):
    error = api_error(status, {"detail": "what happened", "code": "some_code"}, request="GET /campaigns/3")
    assert type(error) is error_class and isinstance(error, MapCampaignError)
    assert (error.status, error.code, error.detail) == (status, "some_code", "what happened")
    assert str(error) == f"GET /campaigns/3: what happened (HTTP {status}, some_code)"


def test_a_422_carries_the_field_paths_relative_to_the_body():
    body = {
        "code": "invalid_request",
        "detail": [
            {"field": "body.pixelization.nside", "loc": ["body", "pixelization", "nside"], "msg": "bad", "type": "x"},
            {"field": "query.limit", "loc": ["query", "limit"], "msg": "too big", "type": "y"},
            {"field": "body", "loc": ["body"], "msg": "missing", "type": "z"},
        ],
    }
    error = api_error(422, body)
    assert isinstance(error, InvalidRequest)
    assert error.problems == [("pixelization.nside", "bad"), ("query.limit", "too big"), ("", "missing")]
    assert "pixelization.nside: bad" in str(error)
    assert api_error(422, {"detail": "a sentence", "code": "invalid"}).problems == [("", "a sentence")]


def test_an_answer_that_is_not_json_keeps_its_text():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html>bad gateway</html>")

    with client_answering(handler) as client, pytest.raises(ApiError) as failed:
        client.get(1)
    assert (failed.value.status, failed.value.code, failed.value.detail) == (502, "http_502", "<html>bad gateway</html>")


def test_no_answer_at_all_is_service_unavailable_without_a_status():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with client_answering(handler) as client, pytest.raises(ServiceUnavailable) as failed:
        client.list()
    assert failed.value.status is None and failed.value.code == "unreachable"
    assert "cannot reach the service at http://service.test" in str(failed.value)


def campaign_summary(campaign_id: int) -> dict:
    return {
        "id": campaign_id,
        "name": f"c{campaign_id}",
        "owner": "local",
        "kind": "signal+noise",
        "state": "queued",
        "priority": 0,
        "max_attempts": 3,
        "realizations": 1,
        "scan_key": "k",
        "spec_hash": "h",
        "ranks": 2,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
    }


def test_list_follows_the_cursor_and_stops_at_the_limit():
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        cursor = int(request.url.params.get("cursor", "0"))
        asked.append((cursor, int(request.url.params["limit"])))
        items = [campaign_summary(cursor + i) for i in range(min(2, int(request.url.params["limit"])))]
        last = cursor + len(items)
        return httpx.Response(200, json={"items": items, "next_cursor": str(last) if last < 6 else None})

    with client_answering(handler) as client:
        assert [c.id for c in client.list()] == [0, 1, 2, 3, 4, 5]
        assert asked == [(0, 500), (2, 500), (4, 500)]
        asked.clear()
        assert [c.id for c in client.list(limit=3)] == [0, 1, 2]
        assert asked == [(0, 3), (2, 1)]


def test_a_bad_spec_is_never_sent():
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    with client_answering(handler) as client, pytest.raises(InvalidRequest) as refused:
        client.submit(spec_data(**{"focal_plane.sample_rate_hz": True}))
    assert refused.value.status is None and refused.value.code == "invalid_spec"
    assert [field for field, _ in refused.value.problems] == ["focal_plane.sample_rate_hz"]
    assert sent == []


def test_a_spec_is_sent_as_its_validated_json_with_the_idempotency_key():
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(409, json={"detail": "busy", "code": "conflict"})

    with client_answering(handler) as client, pytest.raises(Conflict):
        client.submit(spec_data(name="sent"), idempotency_key="k1")
    [request] = sent
    assert (request.method, request.url.path) == ("POST", "/api/v1/campaigns")
    assert request.headers["Idempotency-Key"] == "k1" and request.headers["Authorization"] == "Bearer t"
    assert json.loads(request.content)["name"] == "sent"


def test_wait_timeout_is_a_timeout_error():
    assert issubclass(WaitTimeout, TimeoutError) and issubclass(WaitTimeout, MapCampaignError)


def test_products_arrays_have_nan_where_the_service_reports_null():
    summary = ProductsSummary.model_validate(
        {
            "campaign_id": 1,
            "kind": "noise-only",
            "campaign_state": "running",
            "succeeded": 1,
            "included": 1,
            "spectra_realizations": 1,
            "map_realizations": 0,
            "ready": True,
            "generation": 1,
            "bins": {"ell_min": [2, 4], "ell_max": [3, 5], "ell_center": [2.5, 4.5], "lmax": 5, "ell_bin_width": 2},
            "spectra": {"TT": {"mean": [1.0, 2.0], "std": None}},
            "noise_bias": {"spectra": {"TT": {"value": [0.5, None], "std": None, "error": None}}},
            "downloads": ProductDownloads().model_dump(),
        }
    )
    products = Products.from_summary(summary)
    np.testing.assert_array_equal(products.ell_min, [2, 4])
    np.testing.assert_array_equal(products.spectra_mean["TT"], [1.0, 2.0])
    assert products.spectra_std["TT"].shape == (2,) and np.isnan(products.spectra_std["TT"]).all()
    np.testing.assert_array_equal(products.pseudo_noise_bias["TT"].value, [0.5, np.nan])
    assert np.isnan(products.pseudo_noise_bias["TT"].error).all() and products.pseudo_transfer_function == {}
    assert products.noise_bias == {} and products.transfer_function == {}  # no bandpowers yet


def signal_only_summary() -> ProductsSummary:
    """A signal-only campaign of 4 realisations with F_l and F_b that differ, so a test can tell them apart."""
    estimate = {"value": [0.9, None], "error": [0.05, None]}
    spectra = ("TT", "EE", "BB", "TE", "EB", "TB")
    return ProductsSummary.model_validate(
        {
            "campaign_id": 7,
            "kind": "signal-only",
            "campaign_state": "succeeded",
            "succeeded": 4,
            "included": 4,
            "spectra_realizations": 4,
            "map_realizations": 4,
            "ready": True,
            "generation": 4,
            "bins": {"ell_min": [2, 4], "ell_max": [3, 5], "ell_center": [2.5, 4.5], "lmax": 5, "ell_bin_width": 2},
            "spectra": {"TT": {"mean": [1.0, 2.0], "std": [0.1, 0.2]}},
            "transfer_function": {
                "beam_fwhm_arcmin": 60.0,
                "model": {"TT": [1.0, 1.0]},
                "spectra": {"TT": {"value": [1.9, 1.8], "std": None, "error": None}},
            },
            "bandpowers": {
                "n": 4,
                "bins": {"ell_lo": [2, 6], "ell_hi": [5, 9], "ell_center": [3.5, 7.5], "lmax": 9, "bin_width": 4,
                         "reliable": [True, False]},
                "purify_b": False,
                "mask_sha256": "0" * 64,
                "mean": {name: {"value": [1e-12, 2e-12], "error": [1e-13, 1e-13]} for name in spectra},
                "transfer_function": {name: estimate for name in spectra},
            },
            "downloads": ProductDownloads().model_dump(),
        }
    )


def test_the_transfer_function_is_f_b_and_f_l_is_named_a_pseudo_cl_ratio():
    products = Products.from_summary(signal_only_summary())
    np.testing.assert_array_equal(products.transfer_function["TT"].value, [0.9, np.nan])
    np.testing.assert_allclose(products.transfer_function["TT"].std, [0.1, np.nan])  # error sqrt(n), n = 4
    np.testing.assert_array_equal(products.pseudo_transfer_function["TT"].value, [1.9, 1.8])
    assert products.bandpowers is not None and list(products.bandpowers.reliable) == [True, False]


def test_the_repr_of_products_is_one_line_naming_what_there_is():
    shown = repr(Products.from_summary(signal_only_summary()))
    assert shown.startswith("<Products of campaign 7 (signal-only, succeeded): 4 realisation(s) included;")
    assert "transfer_function" in shown and "array" not in shown and "\n" not in shown and len(shown) < 200


def campaign_detail(state: str, succeeded: int) -> dict:
    counts = {name: 0 for name in ("queued", "claimed", "running", "succeeded", "failed", "cancelled")}
    counts.update(queued=2 - succeeded, succeeded=succeeded)
    return {
        **campaign_summary(1),
        "state": state,
        "realizations": 2,
        "spec": spec_data(),
        "progress": {"counts": counts, "done": succeeded, "total": 2},
    }


def test_watch_polls_when_the_event_stream_is_unavailable_and_reports_only_changes():
    states = iter(
        [("queued", 0), ("queued", 0), ("queued", 0), ("running", 1), ("running", 1), ("succeeded", 2)]
    )
    streams_tried = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/events":
            streams_tried.append(request.url.params["campaign_id"])
            return httpx.Response(503, json={"detail": "no streams today", "code": "unavailable"})
        state, succeeded = next(states)
        return httpx.Response(200, json=campaign_detail(state, succeeded))

    with client_answering(handler) as client:
        seen = [(str(detail.state), detail.progress.counts["succeeded"]) for detail in client.watch(1, poll_s=0.01)]
    assert seen == [("queued", 0), ("running", 1), ("succeeded", 2)]
    assert streams_tried and set(streams_tried) == {"1"}


def test_a_validator_s_message_comes_without_pydantic_s_prefix():
    from mapcampaign.client import campaign_spec

    with pytest.raises(InvalidRequest) as refused:
        campaign_spec(spec_data(kind="signal-only", sky={"kind": "none"}))
    (problem,) = refused.value.problems
    assert "needs a sky" in problem[1] and not problem[1].startswith("Value error"), problem


def test_a_noise_only_spec_with_a_sky_is_told_the_sky_is_ignored(tmp_path):
    from mapcampaign.cli.campaigns import describe_outcome, submit_one
    from mapcampaign.client import campaign_spec, spec_notes

    assert spec_notes(campaign_spec(spec_data(kind="noise-only", sky={"kind": "none"}))) == []
    without_section = {key: value for key, value in spec_data(kind="noise-only").items() if key != "sky"}
    assert spec_notes(campaign_spec(without_section)) == []
    (note,) = spec_notes(campaign_spec(spec_data(kind="noise-only", sky={"kind": "cmb"})))
    assert "ignored" in note and note.startswith("sky:")
    with (
        mapcampaign.Client(server="http://127.0.0.1:9", token="t") as client,
        pytest.warns(UserWarning, match="ignored"),
        pytest.raises(ServiceUnavailable),
    ):
        client.submit(spec_data(kind="noise-only", sky={"kind": "cmb"}))
    spec_file = tmp_path / "noise-with-sky.json"
    spec_file.write_text(json.dumps(spec_data(kind="noise-only", sky={"kind": "cmb"})))
    line = describe_outcome(submit_one(None, spec_file, dry_run=True, new=False))
    assert "valid" in line and "note: sky: a noise-only campaign simulates no sky" in line
