"""Campaigns over the REST API: create (idempotent), list, read with progress, cancel, retry, delete."""

from __future__ import annotations

from sqlalchemy import func, select

from service.campaigns.models import Campaign, Realization
from tests.support.service_helpers import spec_data


def count_rows(api, model) -> int:
    with api.database.session(write=False) as session:
        return session.scalar(select(func.count()).select_from(model))


def test_create_and_read(api):
    created = api.create(realizations=5)
    assert created["state"] == "queued" and created["owner"] == "alice"
    assert created["progress"]["counts"]["queued"] == 5 and created["progress"]["total"] == 5
    assert set(created["progress"]["counts"]) == {"queued", "claimed", "running", "succeeded", "failed", "cancelled"}
    read = api.campaign(created["id"])
    assert read["spec"]["realizations"] == 5 and read["scan_key"] == created["scan_key"]
    assert read["progress"]["throughput_per_hour"] is None and read["progress"]["eta_seconds"] is None


def test_list_filters_and_cursor_pagination(api):
    ids = [api.create(name=f"Run {n} {'ground' if n % 2 else 'space'}", realizations=1)["id"] for n in range(7)]
    api.create(name="noise run", kind="noise-only", realizations=1)
    seen, cursor = [], None
    while True:
        answer = api.get("/campaigns", params={"limit": 3, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200
        page = answer.json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        api.create(name="added while paging", realizations=1)  # must not shift later pages
    assert seen[1:8] == sorted(ids, reverse=True) and len(seen) == len(set(seen)) == 8
    names = [item["name"] for item in api.get("/campaigns", params={"name": "GROUND"}).json()["items"]]
    assert names and all("ground" in name for name in names)
    kinds = api.get("/campaigns", params={"kind": "noise-only"}).json()["items"]
    assert [item["name"] for item in kinds] == ["noise run"]
    assert api.get("/campaigns", params={"state": "running"}).json()["items"] == []
    bad = api.get("/campaigns", params={"cursor": "not-a-cursor"})
    assert bad.status_code == 422 and "cursor" in bad.json()["detail"]


def test_idempotent_create(api):
    body = spec_data(realizations=3)
    first = api.post("/campaigns", json=body, headers={"Idempotency-Key": "k-1"})
    again = api.post("/campaigns", json=body, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    different = api.post("/campaigns", json=spec_data(realizations=4), headers={"Idempotency-Key": "k-1"})
    assert different.status_code == 409
    assert "Idempotency-Key" in different.json()["detail"] and different.json()["code"] == "idempotency_key_reused"
    other_user = api.post("/campaigns", api.bob, json=body, headers={"Idempotency-Key": "k-1"})
    assert other_user.status_code == 201 and other_user.json()["id"] != first.json()["id"]
    assert count_rows(api, Campaign) == 2 and count_rows(api, Realization) == 6


def test_invalid_spec_names_the_field_and_stores_nothing(api):
    cases = [
        ({"realizations": 100_001}, "body.realizations"),
        ({"resources.ranks": 65_537}, "body.resources.ranks"),
        ({"pixelization.nside": 33}, "body.pixelization.nside"),
        ({"scan.spin_period_s": -1}, "body.scan.spin_period_s"),
    ]
    for changes, field in cases:
        answer = api.post("/campaigns", json=spec_data(**changes))
        assert answer.status_code == 422, answer.text
        assert field in [problem["field"] for problem in answer.json()["detail"]], answer.json()
    bad_detector = spec_data()
    bad_detector["focal_plane"]["detectors"][0]["name"] = "bad name!"
    answer = api.post("/campaigns", json=bad_detector)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["field"] == "body.focal_plane.detectors.0.name"
    unknown = spec_data()
    unknown["colour"] = "blue"
    assert api.post("/campaigns", json=unknown).json()["detail"][0]["field"] == "body.colour"
    assert api.post("/campaigns", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    bad_key = api.post("/campaigns", json=spec_data(), headers={"Idempotency-Key": "x" * 201})
    assert bad_key.status_code == 422 and bad_key.json()["detail"][0]["field"] == "header.Idempotency-Key"
    assert count_rows(api, Campaign) == 0 and count_rows(api, Realization) == 0


def test_a_clone_s_bad_change_is_answered_as_a_request_validation_error(api):
    """The spec a clone's changes make is validated by the service, not by the request's model; its 422 reads
    like any other: each problem's field, its pydantic ``loc`` under ``body.changes``, the reason, the type."""
    source = api.create(realizations=1)
    answer = api.post(
        f"/campaigns/{source['id']}/clone", json={"changes": {"pixelisation": {"nside": 16}, "pixelization": {"nside": 33}}}
    )
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["code"] == "invalid_request" and set(body) == {"detail", "code"}
    by_field = {problem["field"]: problem for problem in body["detail"]}
    assert set(by_field) == {"body.changes.pixelisation", "body.changes.pixelization.nside"}
    typo, nside = by_field["body.changes.pixelisation"], by_field["body.changes.pixelization.nside"]
    assert typo["loc"] == ["body", "changes", "pixelisation"] and typo["type"] == "value_error"
    assert "did you mean 'pixelization'" in typo["msg"]
    assert nside["loc"] == ["body", "changes", "pixelization", "nside"] and nside["type"] == "value_error"
    assert count_rows(api, Campaign) == 1


def test_cancel(api):
    campaign = api.create(realizations=3)
    worker = api.register()
    api.build_plan(worker)
    task = api.claim(worker)[0]
    answer = api.post(f"/campaigns/{campaign['id']}/cancel", json={"reason": "wrong noise level"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["state"] == "cancelled" and body["cancel_reason"] == "wrong noise level" and body["finished_at"]
    assert body["progress"]["counts"]["cancelled"] == 3
    beat = api.wpost(f"/workers/{worker}/heartbeat", json={"running": [task["task_id"]]}).json()
    assert beat["cancel"] == [task["task_id"]] and beat["extended"] == []
    assert api.succeed(task).status_code == 409
    assert api.claim(worker) == []
    assert api.post(f"/campaigns/{campaign['id']}/cancel").status_code == 409
    history = api.realization(campaign["id"], task["realization"])["attempt_history"]
    assert history[0]["failure_class"] == "cancelled"


def test_retry_failed_gives_a_fresh_budget(api):
    campaign = api.create(realizations=2, max_attempts=1)
    worker = api.register()
    api.build_plan(worker)
    first, second = api.claim(worker, max_tasks=2)
    assert api.succeed(first).status_code == 200
    assert api.fail(second["task_id"], "oom", 137).json()["state"] == "failed"
    failed = api.campaign(campaign["id"])
    assert failed["state"] == "failed" and "1 of 2" in failed["failure_cause"]
    retry = api.post(f"/campaigns/{campaign['id']}/retry")
    assert retry.status_code == 200 and retry.json()["requeued"] == 1
    again = api.campaign(campaign["id"])
    assert again["state"] == "running" and again["failure_cause"] is None and again["finished_at"] is None
    task = api.claim(worker)[0]
    assert task["realization"] == second["realization"] and task["attempt"] == 2
    assert api.succeed(task).status_code == 200
    done = api.campaign(campaign["id"])
    assert done["state"] == "succeeded" and done["progress"]["counts"]["succeeded"] == 2
    assert [a["number"] for a in api.realization(campaign["id"], task["realization"])["attempt_history"]] == [1, 2]


def test_delete_only_when_finished(api):
    campaign = api.create(realizations=1)
    assert api.request("DELETE", f"/campaigns/{campaign['id']}", api.alice).status_code == 409
    api.post(f"/campaigns/{campaign['id']}/cancel")
    folder = api.settings.products_dir / str(campaign["id"])
    folder.mkdir(parents=True)
    assert api.request("DELETE", f"/campaigns/{campaign['id']}", api.alice).status_code == 204
    assert api.get(f"/campaigns/{campaign['id']}").status_code == 404
    assert not folder.exists() and count_rows(api, Realization) == 0


def test_ids_of_a_deleted_campaign_are_never_handed_out_again(api):
    """Found by review: SQLite reused the newest deleted ids, so a worker's late report on a task of a
    deleted campaign (task id realize-<attempt id>) ended the live attempt of the next campaign."""
    campaign = api.create(realizations=1)
    worker = api.register()
    api.build_plan(worker)
    stale = api.claim(worker)[0]
    api.post(f"/campaigns/{campaign['id']}/cancel")
    assert api.request("DELETE", f"/campaigns/{campaign['id']}", api.alice).status_code == 204
    after = api.create(realizations=1)
    assert after["id"] != campaign["id"]
    fresh = api.claim(worker)[0]
    assert fresh["task_id"] != stale["task_id"]
    assert api.fail(stale["task_id"], "cancelled", -15).status_code == 404  # the old task is gone, not the new one
    assert api.realization(after["id"], 0)["state"] == "claimed"


def test_realisations_paginated_filtered_and_progress(api):
    campaign = api.create(realizations=12)
    worker = api.register()
    api.build_plan(worker)
    tasks = api.claim(worker, max_tasks=4)
    for task in tasks[:3]:
        assert api.succeed(task).status_code == 200
    pages, cursor = [], None
    while True:
        answer = api.get(
            f"/campaigns/{campaign['id']}/realizations", params={"limit": 5, **({"cursor": cursor} if cursor else {})}
        ).json()
        pages.append([item["index"] for item in answer["items"]])
        cursor = answer["next_cursor"]
        if not cursor:
            break
    assert [index for page in pages for index in page] == list(range(12)) and len(pages) == 3
    succeeded = api.get(f"/campaigns/{campaign['id']}/realizations", params={"state": "succeeded"}).json()["items"]
    assert [item["index"] for item in succeeded] == [0, 1, 2]
    claimed = api.get(f"/campaigns/{campaign['id']}/realizations", params={"state": "claimed"}).json()["items"]
    assert [item["lease_holder"] for item in claimed] == ["w1"]
    one = api.realization(campaign["id"], 0)
    assert one["result"]["iterations"] == 3 and one["attempt_history"][0]["worker"] == "w1"
    assert api.get(f"/campaigns/{campaign['id']}/realizations/99").status_code == 404
    progress = api.campaign(campaign["id"])["progress"]
    assert progress["done"] == 3 and progress["throughput_per_hour"] > 0 and progress["eta_seconds"] > 0
