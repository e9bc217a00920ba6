"""The queue over the REST API: claim order, plan builds, leases, attempts, results, artifacts."""

from __future__ import annotations

import shutil

import pytest
from sqlalchemy import select, update

from service.campaigns.hooks import on_result_accepted, remove_result_hook
from service.campaigns.models import Campaign
from service.db import utcnow
from service.events.models import Event
from tests.support.databases import on_database, statements_sent
from tests.support.service_helpers import product, result_for, sha256, spec_data


def test_claim_order_priority_then_age_then_index(api):
    low = api.create(name="low", realizations=2, priority=0)
    high = api.create(name="high", realizations=2, priority=5)
    older_high = high  # created before the next one: same priority, older first
    newer_high = api.create(name="newer high", realizations=1, priority=5)
    worker = api.register()
    api.build_plan(worker)  # one plan: every campaign has the demo scan and ranks
    order = [(task["campaign_id"], task["realization"]) for task in api.claim(worker, max_tasks=10)]
    assert order == [
        (older_high["id"], 0),
        (older_high["id"], 1),
        (newer_high["id"], 0),
        (low["id"], 0),
        (low["id"], 1),
    ]
    assert api.claim(worker) == []
    assert api.campaign(low["id"])["state"] == "running"


def test_plan_built_once_per_scan_key_ranks_site_and_shared(api):
    first = api.create(name="a", realizations=2, seed=1, **{"noise.f_knee_hz": 0.05})
    second = api.create(name="b", realizations=2, seed=2, **{"noise.f_knee_hz": 0.2, "sky.seed": 9})
    other_ranks = api.create(name="c", realizations=1, **{"resources.ranks": 4})
    assert first["scan_key"] == second["scan_key"] == other_ranks["scan_key"]
    builder, helper, remote = api.register("builder"), api.register("helper"), api.register("remote", site="nersc")

    tasks = api.claim(builder, max_tasks=1)
    assert [t["kind"] for t in tasks] == ["preprocess"] and tasks[0]["ranks"] == 2 and tasks[0]["site"] == "local"
    shared = tasks[0]
    # The same (scan key, 2 ranks, local) is being built: the helper gets the 4-rank plan, never a second build.
    helper_tasks = api.claim(helper, max_tasks=5)
    assert [(t["kind"], t["ranks"]) for t in helper_tasks] == [("preprocess", 4)]
    assert api.claim(helper, max_tasks=5) == []  # nothing runnable while plans build
    remote_task = api.claim(remote, max_tasks=1)
    assert remote_task[0]["kind"] == "preprocess" and remote_task[0]["site"] == "nersc"

    assert api.plan_built(shared["task_id"]).status_code == 200
    assert api.plan_built(shared["task_id"]).status_code == 409  # reported once
    realize = api.claim(helper, max_tasks=10)
    assert {t["campaign_id"] for t in realize} == {first["id"], second["id"]}
    assert {t["plan"]["id"] for t in realize} == {shared["plan_id"]} and len(realize) == 4
    for task in realize:
        assert api.succeed(task).status_code == 200

    plans = api.get("/plans").json()["items"]
    assert sorted((p["ranks"], p["site"], p["state"]) for p in plans) == [
        (2, "local", "ready"),
        (2, "nersc", "building"),
        (4, "local", "building"),
    ]
    ready = api.get(f"/plans/{shared['plan_id']}").json()
    assert ready["uses"] == 4 and ready["build_attempts"] == 1 and ready["path"] == "/plans/p.h5"
    assert api.get("/plans", params={"site": "nersc"}).json()["items"][0]["lease_holder"] == "remote"
    assert api.get("/plans/999").status_code == 404


def test_failed_build_is_retried_then_campaigns_fail_with_the_cause(make_api):
    api = make_api(max_plan_builds=2)
    one = api.create(name="one", realizations=2)
    two = api.create(name="two", realizations=1, seed=77)
    worker = api.register()
    first = api.claim(worker)[0]
    assert api.fail(first["task_id"], "app_error", 1).json()["state"] == "failed"
    second = api.claim(worker)[0]
    assert second["kind"] == "preprocess" and second["plan_id"] == first["plan_id"]
    assert second["task_id"] != first["task_id"]
    answer = api.wpost(
        f"/tasks/{second['task_id']}/failed",
        json={"failure_class": "oom", "exit_code": 137, "message": "plan build ran out of memory"},
    )
    assert answer.status_code == 200
    for campaign in (one, two):
        failed = api.campaign(campaign["id"])
        assert failed["state"] == "failed" and failed["finished_at"]
        assert "preprocessing" in failed["failure_cause"] and "ran out of memory" in failed["failure_cause"]
        assert failed["progress"]["counts"]["failed"] == campaign["realizations"]
    plan = api.get(f"/plans/{first['plan_id']}").json()
    assert plan["state"] == "failed" and plan["build_attempts"] == 2 and "oom" in plan["last_error"]
    assert api.claim(worker) == []
    # Submitting again gives the plan a fresh budget.
    api.create(name="three", realizations=1)
    third = api.claim(worker)[0]
    assert third["kind"] == "preprocess" and third["task_id"] not in (first["task_id"], second["task_id"])


@pytest.mark.parametrize("failure_class", ["drained", "site_error"])
def test_plan_builds_ended_by_the_site_are_given_back_up_to_a_limit(make_api, failure_class):
    """A worker stopped under a plan build, or unable to launch it at its site, does not use up
    max_plan_builds (found by review: three worker restarts during one long build failed every campaign
    needing the plan)."""
    from service.queue.tasks import UNCHARGED_FAILURES

    api = make_api(max_plan_builds=1)
    campaign = api.create(realizations=1)
    worker = api.register()
    for _ in range(UNCHARGED_FAILURES[failure_class]):
        build = api.claim(worker)[0]
        assert build["kind"] == "preprocess"
        assert api.fail(build["task_id"], failure_class, -15).status_code == 200
        plan = api.get(f"/plans/{build['plan_id']}").json()
        assert plan["state"] == "failed" and plan["build_attempts"] == 0 and failure_class in plan["last_error"]
        assert api.campaign(campaign["id"])["state"] == "queued"
    last = api.claim(worker)[0]
    assert api.fail(last["task_id"], failure_class, -15).status_code == 200  # one too many: charged
    assert api.campaign(campaign["id"])["state"] == "failed"


def test_a_plan_failing_at_one_site_does_not_fail_campaigns_another_site_serves(make_api):
    """Found by review: a build exhausted at site b failed the campaign although site a had the plan and
    was running it."""
    api = make_api(max_plan_builds=1)
    campaign = api.create(realizations=3)
    at_a = api.register("wa", site="a")
    at_b = api.register("wb", site="b")
    api.build_plan(at_a)
    running = api.claim(at_a)[0]
    assert running["kind"] == "realize"
    build = api.claim(at_b)[0]
    assert build["kind"] == "preprocess"
    assert api.fail(build["task_id"], "app_error", 1).status_code == 200
    assert api.campaign(campaign["id"])["state"] in ("queued", "running")
    assert api.succeed(running).status_code == 200
    assert [task["kind"] for task in api.claim(at_a, max_tasks=2)] == ["realize", "realize"]


def test_campaigns_left_unfailed_by_an_interrupted_plan_failure_are_failed_by_the_reaper(make_api):
    """Found by review: the plan is marked exhausted first and its campaigns failed afterwards, one at a
    time; cut short there (the API killed), nothing failed them later and they stayed queued for ever."""
    from sqlalchemy import update

    from service.queue.models import PreprocessingPlan

    api = make_api(max_plan_builds=1)
    campaign = api.create(realizations=1)
    worker = api.register()
    build = api.claim(worker)[0]
    assert api.fail(build["task_id"], "app_error", 1).status_code == 200
    assert api.campaign(campaign["id"])["state"] == "failed"
    stranded = api.create(name="stranded", realizations=1)  # queued after the failure: a fresh budget...
    with api.database.session() as session:  # ...unless the failure was recorded later than it was queued
        session.execute(update(PreprocessingPlan).values(failed_at=utcnow()))
        session.commit()
    assert api.campaign(stranded["id"])["state"] == "queued"
    assert api.reap().stranded_campaigns == 1
    failed = api.campaign(stranded["id"])
    assert failed["state"] == "failed" and "preprocessing" in failed["failure_cause"]
    assert api.reap().stranded_campaigns == 0  # once


def test_expired_lease_requeues_as_lost_worker(make_api, clock):
    api = make_api(lease_s=60)
    campaign = api.create(realizations=1, max_attempts=3)
    worker = api.register()
    api.build_plan(worker)
    task = api.claim(worker)[0]
    assert (
        api.wpost(f"/tasks/{task['task_id']}/started", json={"host": "node7", "scheduler_job_id": "123"}).json()[
            "state"
        ]
        == "running"
    )
    assert api.reap().realizations == 0  # the lease holds
    clock.advance(61)
    assert api.reap().realizations == 1
    assert api.reap().realizations == 0  # handled once
    realization = api.realization(campaign["id"], 0)
    assert realization["state"] == "queued" and realization["lease_holder"] is None
    attempt = realization["attempt_history"][0]
    assert (
        attempt["failure_class"] == "lost_worker"
        and attempt["host"] == "node7"
        and attempt["scheduler_job_id"] == "123"
    )
    assert api.succeed(task).status_code == 409  # the late report changes nothing
    assert api.fail(task["task_id"]).status_code == 409
    beat = api.wpost(f"/workers/{worker}/heartbeat", json={"running": [task["task_id"]]}).json()
    assert beat["lost"] == [task["task_id"]] and beat["extended"] == []
    again = api.claim(worker)[0]
    assert again["realization"] == 0 and again["attempt"] == 2
    assert api.succeed(again).status_code == 200
    assert api.realization(campaign["id"], 0)["state"] == "succeeded"


def test_the_reaper_settles_a_campaign_once_per_pass_not_once_per_expired_lease(make_api, clock):
    """Found by review: each expired lease re-counted the whole campaign (GROUP BY over its realisations)
    inside the reaper's one write transaction: 1000 expired leases of a 100k campaign held SQLite's write
    lock for 32 s. The statements of one pass are counted here: settling reads the campaign's kept counts
    once (migration 0005), and nothing counts its realisations row by row."""
    api = make_api(lease_s=60)
    campaign = api.create(realizations=40, max_attempts=1)
    worker = api.register(capacity=20)
    api.build_plan(worker)
    assert len(api.claim(worker, max_tasks=20)) == 20
    clock.advance(61)
    with statements_sent(api.database.engine) as statements:
        assert api.reap().realizations == 20
    assert sum("GROUP BY" in statement.upper() for statement in statements) == 0
    assert sum("FROM realization_counts" in statement for statement in statements) == 1
    assert api.campaign(campaign["id"])["progress"]["counts"]["failed"] == 20  # one attempt each: failed
    assert api.campaign(campaign["id"])["state"] == "running"  # 20 still queued


def test_heartbeat_extends_leases(api):
    campaign = api.create(realizations=1)
    worker = api.register()
    api.build_plan(worker)
    task = api.claim(worker)[0]
    before = api.realization(campaign["id"], 0)["lease_expires_at"]
    beat = api.wpost(f"/workers/{worker}/heartbeat", json={"running": [task["task_id"]]}).json()
    assert beat["extended"] == [task["task_id"]] and beat["cancel"] == beat["lost"] == []
    after = api.realization(campaign["id"], 0)["lease_expires_at"]
    assert after == beat["lease_expires_at"] and after >= before
    other = api.register("w2")
    assert api.wpost(f"/workers/{other}/heartbeat", json={"running": [task["task_id"]]}).json()["lost"] == [
        task["task_id"]
    ]
    assert api.wpost(f"/workers/{worker}/heartbeat", json={"running": ["bogus"]}).json()["lost"] == ["bogus"]
    assert api.wpost(f"/workers/{other}/heartbeat", api.bob_worker, json={"running": []}).status_code == 403


def test_expired_plan_lease_counts_as_a_build_attempt(make_api, clock):
    api = make_api(lease_s=60, max_plan_builds=3)
    api.create(realizations=1)
    worker = api.register()
    build = api.claim(worker)[0]
    assert api.reap().plans == 0  # the lease holds
    clock.advance(61)
    assert api.reap().plans == 1
    plan = api.get(f"/plans/{build['plan_id']}").json()
    assert plan["state"] == "failed" and "lost_worker" in plan["last_error"] and plan["build_attempts"] == 1
    assert api.plan_built(build["task_id"]).status_code == 409
    rebuild = api.claim(worker)[0]
    assert rebuild["kind"] == "preprocess" and rebuild["build_attempt"] == 2


def test_attempts_capped_then_realisation_fails(api):
    campaign = api.create(realizations=1, max_attempts=2)
    worker = api.register()
    api.build_plan(worker)
    first = api.claim(worker)[0]
    assert api.fail(first["task_id"], "walltime", None).json()["state"] == "queued"
    second = api.claim(worker)[0]
    assert second["attempt"] == 2
    assert api.fail(second["task_id"], "app_error", 3).json()["state"] == "failed"
    assert api.claim(worker) == []
    body = api.campaign(campaign["id"])
    assert body["state"] == "failed" and body["failure_cause"] == "1 of 1 realisations failed"
    history = api.realization(campaign["id"], 0)["attempt_history"]
    assert [(a["failure_class"], a["exit_code"]) for a in history] == [("walltime", None), ("app_error", 3)]
    assert history[1]["log_tail"] == "Traceback: boom"


@pytest.mark.parametrize("failure_class", ["drained", "site_error"])
def test_attempts_ended_by_the_site_are_given_back_up_to_a_limit(api, failure_class):
    """A worker stopped under a running task (``drained``) or unable to launch it at its site (``site_error``:
    disk full, Parsl refusing) does not use up the realisation's attempts; past the limit of each class they
    count, so a realisation cannot go round for ever. Found by review for ``site_error``: a broken site's
    launch failures were charged ``launch_error``, three realisations' attempts per pause of the worker."""
    from service.queue.tasks import UNCHARGED_FAILURES

    limit = UNCHARGED_FAILURES[failure_class]
    campaign = api.create(realizations=1, max_attempts=1)
    worker = api.register()
    api.build_plan(worker)
    for given_back in range(1, limit + 1):
        task = api.claim(worker)[0]
        assert task["attempt"] == given_back  # numbered on, but always the first of the budget
        assert api.fail(task["task_id"], failure_class, -15).json()["state"] == "queued"
    last = api.claim(worker)[0]
    assert api.fail(last["task_id"], failure_class, -15).json()["state"] == "failed"  # one too many: charged
    history = api.realization(campaign["id"], 0)["attempt_history"]
    assert [a["failure_class"] for a in history] == [failure_class] * (limit + 1)
    assert api.campaign(campaign["id"])["state"] == "failed"
    # Another failure class is charged at once: max_attempts 1 fails on the first.
    other = api.create(realizations=1, max_attempts=1)
    task = api.claim(worker)[0]
    assert task["campaign_id"] == other["id"]
    assert api.fail(task["task_id"], "lost_worker", -15).json()["state"] == "failed"


def test_result_accepted_once_and_late_duplicate_refused(api):
    campaign = api.create(realizations=2)
    worker = api.register()
    api.build_plan(worker)
    task, other = api.claim(worker, max_tasks=2)
    accepted = api.succeed(task)
    assert accepted.status_code == 200 and accepted.json()["state"] == "succeeded"
    stored = api.realization(campaign["id"], task["realization"])["result"]
    duplicate = api.succeed(task)
    assert duplicate.status_code == 409 and duplicate.json()["code"] == "result_already_accepted"
    assert api.fail(task["task_id"]).status_code == 409
    assert api.realization(campaign["id"], task["realization"])["result"] == stored
    # A result that does not match its task is refused and changes nothing.

    wrong = result_for(other["spec"], other["realization"] + 1)
    refused = api.wpost(f"/tasks/{other['task_id']}/succeeded", json={"result": wrong})
    assert refused.status_code == 422 and "realization" in refused.json()["detail"]
    assert api.realization(campaign["id"], other["realization"])["state"] == "claimed"
    # Reports from a token that did not claim the task are refused.
    assert api.succeed(other, token=api.bob_worker).status_code == 403
    assert api.wpost("/tasks/realize-999999/started").status_code == 404
    assert api.wpost("/tasks/nonsense/started").status_code == 404
    assert (
        api.wpost(
            f"/tasks/{other['task_id']}/plan-built",
            json={"path": "p", "checksum": "c", "size_bytes": 1, "build_time_s": 1},
        ).status_code
        == 422
    )


def test_a_campaign_from_before_a_new_spec_default_still_takes_its_results(api):
    """A release that adds a spec field with a default changes the hash the map-maker computes; a campaign
    stored before it (with the older hash) still accepts results hashed from its spec by today's models, and a
    result for some other spec is still refused."""
    campaign = api.create(realizations=2)
    with api.database.session() as session:
        session.execute(update(Campaign).where(Campaign.id == campaign["id"]).values(spec_hash="0" * 64))
        session.commit()
    worker = api.register()
    api.build_plan(worker)
    task, other = api.claim(worker, max_tasks=2)
    assert api.succeed(task).status_code == 200
    foreign = result_for({**other["spec"], "seed": other["spec"]["seed"] + 1}, other["realization"])
    refused = api.wpost(f"/tasks/{other['task_id']}/succeeded", json={"result": foreign})
    assert refused.status_code == 422 and "spec_hash" in refused.json()["detail"]


def test_artifacts_staged_checked_and_moved_into_place(make_api):
    api = make_api(max_artifact_bytes=4096)
    seen = []
    hook = on_result_accepted(seen.append)
    try:
        campaign = api.create(realizations=1)
        worker = api.register()
        api.build_plan(worker)
        task = api.claim(worker)[0]
        maps, hits = b"SIMPLE = T" * 100, b"hits" * 10
        url = f"/tasks/{task['task_id']}/artifacts"

        def put(name, payload, digest=None, token=None):
            return api.request(
                "PUT",
                f"{url}/{name}",
                token or api.alice_worker,
                content=payload,
                headers={"X-Content-SHA256": digest or sha256(payload)},
            )

        assert put("iqu.fits", maps).status_code == 201
        assert put("hits.fits", hits, digest="0" * 64).status_code == 422
        assert put("..", hits).status_code in (404, 422)
        assert put(".hidden", hits).status_code == 422
        assert put("big.fits", b"x" * 5000).status_code == 413
        assert api.request("PUT", f"{url}/hits.fits", api.alice_worker, content=hits).status_code == 422  # no sha
        assert put("hits.fits", hits, token=api.alice).status_code == 403  # user tokens cannot upload

        missing = api.succeed(task, products=[product("iqu.fits", maps), product("hits.fits", hits)])
        assert missing.status_code == 422 and "hits.fits" in missing.json()["detail"]
        assert put("hits.fits", hits).status_code == 201
        assert api.succeed(task, products=[product("iqu.fits", maps), product("hits.fits", hits)]).status_code == 200

        folder = api.settings.products_dir / str(campaign["id"]) / "realizations" / "0"
        assert sorted(p.name for p in folder.iterdir()) == ["hits.fits", "iqu.fits"]
        assert (folder / "iqu.fits").read_bytes() == maps
        assert not any((folder.parent / ".staging").iterdir())
        assert put("late.fits", hits).status_code == 409
        assert [(a.campaign_id, a.realization, a.product_dir) for a in seen] == [(campaign["id"], 0, folder)]
    finally:
        remove_result_hook(hook)


def test_every_state_change_is_an_event_in_order(api):
    campaign = api.create(realizations=1)
    worker = api.register()
    api.build_plan(worker)
    task = api.claim(worker)[0]
    api.wpost(f"/tasks/{task['task_id']}/started")
    api.succeed(task)
    with api.database.session(write=False) as session:
        events = list(session.scalars(select(Event).order_by(Event.id)))
    ids = [event.id for event in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    realisation_states = [e.state for e in events if e.kind == "realization" and e.campaign_id == campaign["id"]]
    assert realisation_states == ["claimed", "running", "succeeded"]
    campaign_states = [e.state for e in events if e.kind == "campaign"]
    assert campaign_states == ["queued", "running", "succeeded"]
    assert [e.state for e in events if e.kind == "plan"] == ["building", "ready"]


def test_uploads_of_a_failed_attempt_are_discarded(api):
    campaign = api.create(realizations=1, max_attempts=2)
    worker = api.register()
    api.build_plan(worker)
    task = api.claim(worker)[0]
    payload = b"partial map"
    upload = api.request(
        "PUT",
        f"/tasks/{task['task_id']}/artifacts/iqu.fits",
        api.alice_worker,
        content=payload,
        headers={"X-Content-SHA256": sha256(payload)},
    )
    assert upload.status_code == 201
    staging = api.settings.products_dir / str(campaign["id"]) / "realizations" / ".staging"
    assert any(staging.iterdir())
    assert api.fail(task["task_id"], "walltime", None).status_code == 200
    assert not any(staging.iterdir())


MAPS = b"SIMPLE = T" * 100


def _upload_maps(api, task):
    return api.request(
        "PUT",
        f"/tasks/{task['task_id']}/artifacts/iqu.fits",
        api.alice_worker,
        content=MAPS,
        headers={"X-Content-SHA256": sha256(MAPS)},
    )


def _nothing_staged(api, campaign_id: int) -> bool:
    staging = api.settings.products_dir / str(campaign_id) / "realizations" / ".staging"
    return not staging.exists() or not any(staging.rglob("*"))


def _a_claimed_task(api) -> tuple[dict, dict]:
    campaign = api.create(realizations=1, max_attempts=2)
    worker = api.register()
    api.build_plan(worker)
    return campaign, api.claim(worker)[0]


def _cancel_as_the_endpoint_does(api, campaign_id: int) -> None:
    """What POST /campaigns/{id}/cancel does, from another session while an upload is in progress."""
    from service.campaigns import lifecycle as campaigns
    from service.storage import ArtifactStore

    with api.database.session() as session:
        owner = session.get(campaigns.Campaign, campaign_id).owner_id
        campaigns.cancel_campaign(session=session, owner_id=owner, campaign_id=campaign_id, reason="test")
        session.commit()
    ArtifactStore(api.settings.products_dir).discard(campaign_id=campaign_id)


def test_an_upload_its_campaign_was_cancelled_under_is_a_409_and_leaves_nothing_staged(api, monkeypatch):
    """The campaign is cancelled while the body is still being written (its staging folder removed under
    the upload): the worker is told its lease is gone, not that the disk is full (a 507 would make it
    retry), and no file of the attempt is left."""
    import os

    campaign, task = _a_claimed_task(api)
    real_fsync = os.fsync
    cancelled = []

    def cancel_while_flushing(fd):
        if ".upload-" in os.readlink(f"/proc/self/fd/{fd}") and not cancelled:
            cancelled.append(fd)
            _cancel_as_the_endpoint_does(api, campaign["id"])
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", cancel_while_flushing)
    upload = _upload_maps(api, task)
    assert cancelled
    assert upload.status_code == 409, upload.text
    assert upload.json()["code"] == "lease_lost"
    assert "cancelled" in upload.json()["detail"]
    assert _nothing_staged(api, campaign["id"])


def test_an_upload_that_outlives_its_attempt_discards_what_it_staged(api, monkeypatch):
    """The attempt ends (and its staging is cleared) after the upload's first check but before its
    folder is made: the upload then stores the file in a folder nobody will clear, so its second
    check must find the attempt gone, answer 409 and remove the file."""
    from service.storage import ArtifactStore

    campaign, task = _a_claimed_task(api)
    real_receive = ArtifactStore.receive

    async def cancel_then_receive(self, chunks, **kwargs):
        _cancel_as_the_endpoint_does(api, campaign["id"])
        return await real_receive(self, chunks, **kwargs)

    monkeypatch.setattr(ArtifactStore, "receive", cancel_then_receive)
    upload = _upload_maps(api, task)
    assert upload.status_code == 409, upload.text
    assert upload.json()["code"] == "lease_lost"
    assert _nothing_staged(api, campaign["id"])


@on_database("postgresql")  # SQLite serialises the two writers
def test_a_report_racing_its_campaigns_deletion_is_a_404(api, monkeypatch):
    """The campaign is deleted after the report has read its attempt but before it locks the rows."""
    from sqlalchemy.orm import Session

    from service.campaigns import lifecycle as campaigns
    from service.campaigns.models import Attempt

    campaign, task = _a_claimed_task(api)
    assert api.post(f"/campaigns/{campaign['id']}/cancel", json={"reason": "test"}).status_code == 200
    real_get = Session.get
    deleted = []

    def delete_after_the_attempt_is_read(self, entity, ident, **kwargs):
        found = real_get(self, entity, ident, **kwargs)
        if entity is Attempt and not deleted:
            deleted.append(ident)
            with api.database.session() as other:  # what DELETE /campaigns/{id} does, in another transaction
                owner = real_get(other, campaigns.Campaign, campaign["id"]).owner_id
                campaigns.delete_campaign(
                    session=other, owner_id=owner, campaign_id=campaign["id"], products_dir=api.settings.products_dir
                )
        return found

    monkeypatch.setattr(Session, "get", delete_after_the_attempt_is_read)
    report = api.wpost(f"/tasks/{task['task_id']}/started")
    assert deleted
    assert report.status_code == 404, report.text
    assert report.json()["code"] == "task_not_found"


def test_a_product_the_service_cannot_write_is_507_and_leaves_no_file(api, monkeypatch):
    """Disk full while an upload is flushed, then a folder that cannot be made: 507 naming the cause, no file kept."""
    import errno
    import os

    campaign = api.create(realizations=1, max_attempts=2)
    worker = api.register()
    api.build_plan(worker)
    task = api.claim(worker)[0]
    maps = b"SIMPLE = T" * 100

    def put():
        return api.request(
            "PUT",
            f"/tasks/{task['task_id']}/artifacts/iqu.fits",
            api.alice_worker,
            content=maps,
            headers={"X-Content-SHA256": sha256(maps)},
        )

    real_fsync = os.fsync

    def disk_full(fd):
        if ".upload-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    realizations = api.settings.products_dir / str(campaign["id"]) / "realizations"
    monkeypatch.setattr(os, "fsync", disk_full)
    full = put()
    monkeypatch.undo()
    assert full.status_code == 507 and full.json()["code"] == "insufficient_storage"
    assert "No space left on device" in full.json()["detail"]
    assert [p.name for p in realizations.rglob("*") if p.is_file()] == []  # no half-written file kept
    refused = api.succeed(task, products=[product("iqu.fits", maps)])
    assert refused.status_code == 422 and "not uploaded" in refused.json()["detail"]

    # The staging folder's place taken by a file (a write that fails as root too): 507, not a bare 500.
    staging = realizations / ".staging"
    shutil.rmtree(staging)
    staging.write_bytes(b"")
    blocked = put()
    assert blocked.status_code == 507 and "Errno" in blocked.json()["detail"]
    staging.unlink()

    # Space back: the same attempt uploads and succeeds.
    assert put().status_code == 201
    assert api.succeed(task, products=[product("iqu.fits", maps)]).status_code == 200
    assert (realizations / "0" / "iqu.fits").read_bytes() == maps


def test_worker_reports_with_nul_or_out_of_range_numbers_are_kept_or_refused_by_field(api):
    """Found by review: PostgreSQL refuses NUL in text, so a crash whose stderr held binary lost its
    failure report (a 422 naming no field, then lost_worker); SQLite took it. Now the log tail keeps
    the text with U+FFFD; other text with NUL, and exit codes beyond 32 bits, are a 422 naming the field."""
    campaign = api.create(realizations=1, max_attempts=2)
    worker = api.register()
    api.build_plan(worker)
    task = api.claim(worker)[0]
    refused = api.wpost(f"/tasks/{task['task_id']}/failed", json={"failure_class": "app_error", "exit_code": 2**31})
    assert refused.status_code == 422 and "exit_code" in refused.text
    started = api.wpost(f"/tasks/{task['task_id']}/started", json={"host": "node\x007"})
    assert started.status_code == 422 and "host" in started.text and "NUL" in started.text
    report = {
        "failure_class": "app_error",
        "exit_code": 139,
        "log_tail": "Segmentation fault\x00\x00 core",
        "message": "a\x00b",
    }
    assert api.wpost(f"/tasks/{task['task_id']}/failed", json=report).status_code == 200
    [attempt] = api.realization(campaign["id"], 0)["attempt_history"]
    assert attempt["failure_class"] == "app_error" and attempt["exit_code"] == 139
    assert attempt["log_tail"] == "Segmentation fault\ufffd\ufffd core"
    cancel = api.post(f"/campaigns/{campaign['id']}/cancel", json={"reason": "oops\x00"})
    assert cancel.status_code == 422 and "reason" in cancel.text
    assert api.campaign(campaign["id"])["state"] != "cancelled"


def test_a_last_event_id_beyond_any_event_is_refused_before_the_stream_starts(api):
    answer = api.get("/events", headers={"Last-Event-ID": "9" * 25})
    assert answer.status_code == 422 and "Last-Event-ID" in answer.text


def test_an_event_stream_moves_past_other_users_events_instead_of_scanning_them_again(api):
    """Found by review: a stream's position moved only with its user's own events, so every poll of an
    idle user's page scanned all events of everyone else since (114 ms a poll at 300k events)."""
    from service.events.router import PAGE, next_page
    from service.events.service import latest_event_id

    api.create(token=api.bob, realizations=2)
    api.post(f"/campaigns/{api.create(token=api.bob, realizations=1)['id']}/cancel", api.bob, json={})
    from service.auth.models import User

    with api.database.session() as session:
        alice_id = session.scalar(select(User.id).where(User.name == "alice"))
        newest = latest_event_id(session=session)
        assert newest > 0
        events, position = next_page(session=session, after_id=0, owner_id=alice_id, campaign_id=None)
    assert events == [] and position == newest  # nothing for alice, and nothing to scan again
    mine = api.create(realizations=1)
    with api.database.session() as session:
        events, after = next_page(session=session, after_id=position, owner_id=alice_id, campaign_id=None)
    assert {e.campaign_id for e in events} == {mine["id"]} and after == events[-1].id
    assert len(events) < PAGE


def test_a_claim_reads_the_sites_plans_in_one_query_whatever_the_number_of_scan_keys(api):
    """Found by review: one plan lookup per active (scan key, ranks) on every claim, every poll."""
    builder = api.register("builder")
    for n in range(6):  # six scan keys, each plan being built by the builder
        api.create(name=f"scan-{n}", **{"scan.drift_deg_per_day": 700.0 + n})
    assert len([t for t in api.claim(builder, max_tasks=10) if t["kind"] == "preprocess"]) == 6
    other = api.register("other")
    with statements_sent(api.database.engine) as statements:
        assert api.claim(other, max_tasks=4) == []  # everything is being built elsewhere
    # The plans come joined to the campaigns that need them (one statement), not in a query per key.
    assert sum("preprocessing_plans" in statement for statement in statements) == 1


@on_database("postgresql")
def test_a_claim_on_postgresql_is_four_statements_on_one_connection_whatever_it_hands_out(api):
    """The claim rate is bound by round trips: the token with the worker's row and heartbeat, the campaigns
    with their plans, the realisations with their attempts, the events under their lock; then the commit."""
    from sqlalchemy import event

    api.create(realizations=40)
    worker = api.register(capacity=20)
    api.build_plan(worker)
    api.claim(worker, max_tasks=1)  # the spec is parsed and cached on the first claim of a campaign
    checkouts: list[object] = []

    def checkout(*args):
        checkouts.append(args)

    event.listen(api.database.engine.pool, "checkout", checkout)
    try:
        counts = {}
        for batch in (1, 20):
            with statements_sent(api.database.engine) as statements:
                assert len(api.claim(worker, max_tasks=batch)) == batch
            counts[batch] = [" ".join(statement.split()[:2]) for statement in statements]
    finally:
        event.remove(api.database.engine.pool, "checkout", checkout)
    assert counts[1] == counts[20]
    assert counts[1] == ["UPDATE workers", "SELECT campaigns.id,", "WITH picked", "WITH event_lock"], counts[1]
    assert len(checkouts) == 2  # one connection a claim


def test_a_claim_answer_stops_at_its_spec_budget_but_hands_out_at_least_one_task(api, monkeypatch):
    """Found by review: every task repeats its campaign's spec, so 200 tasks of a 5,000-detector campaign
    made a 101 MB answer (7 s); the schema allows ten times that."""
    from schemas.spec import CampaignSpec
    from service.queue import claim

    campaign = api.create(realizations=10)
    worker = api.register(capacity=10)
    api.build_plan(worker)
    size = len(CampaignSpec.model_validate(spec_data()).model_dump_json())
    monkeypatch.setattr(claim, "CLAIM_SPEC_BYTES", 3 * size + size // 2)
    assert len(api.claim(worker, max_tasks=10)) == 3
    monkeypatch.setattr(claim, "CLAIM_SPEC_BYTES", size // 2)
    assert len(api.claim(worker, max_tasks=10)) == 1  # a spec larger than the budget still goes, alone
    assert api.campaign(campaign["id"])["progress"]["counts"]["claimed"] == 4


def test_claims_and_heartbeats_refuse_the_wrong_caller_with_the_ordinary_answers(api):
    """The one-statement token check finds nothing for these callers; the ordinary checks then say why."""
    api.create(realizations=1)
    worker = api.register()
    for path, body in ((f"/workers/{worker}/claim", {"max_tasks": 1}), (f"/workers/{worker}/heartbeat", {"running": []})):
        user = api.wpost(path, api.alice, json=body)
        assert user.status_code == 403 and user.json()["code"] == "wrong_token_kind", user.text
        assert api.request("POST", path, "", json=body).status_code == 401
        assert api.wpost(path, "not-a-token", json=body).status_code == 401
        assert api.wpost(path, api.bob_worker, json=body).status_code == 403  # another user's worker
    assert api.claim(worker)[0]["kind"] == "preprocess"  # nothing was claimed by the refused calls


def test_users_read_the_plans_their_campaigns_need_and_an_admin_reads_all(make_api):
    """A plan's row names its site and the path where it was built: another user's plans (and paths) stay
    out of ``GET /plans`` and ``GET /plans/{id}``, unless the caller is in MAPCAMPAIGN_ADMIN_USERS."""
    from service.auth.service import create_token

    api = make_api(admin_users="carol, root")
    with api.database.session() as session:
        carol = create_token(session=session, user_name="carol", kind="user")
        dave = create_token(session=session, user_name="dave", kind="user")
        session.commit()
    alices = api.create(api.alice, name="a", realizations=1)
    api.create(api.bob, name="b", realizations=1, **{"resources.ranks": 4})
    builder = api.register("builder", capacity=2)
    built = {}
    for task in api.claim(builder, max_tasks=2):
        path = f"/scratch/{task['ranks']}-ranks.plan"
        assert task["kind"] == "preprocess" and api.plan_built(task["task_id"], path=path).status_code == 200
        built[task["ranks"]] = task["plan_id"]
    assert set(built) == {2, 4}

    def plans_of(token: str) -> dict[int, str]:
        answer = api.get("/plans", token)
        assert answer.status_code == 200, answer.text
        return {plan["id"]: plan["path"] for plan in answer.json()["items"]}

    assert plans_of(api.alice) == {built[2]: "/scratch/2-ranks.plan"}
    assert plans_of(api.bob) == {built[4]: "/scratch/4-ranks.plan"}
    assert plans_of(dave) == {}
    assert plans_of(carol) == {built[2]: "/scratch/2-ranks.plan", built[4]: "/scratch/4-ranks.plan"}
    assert api.get(f"/plans/{built[4]}", api.alice).status_code == 404
    assert api.get(f"/plans/{built[2]}", dave).status_code == 404
    assert api.get(f"/plans/{built[4]}", carol).json()["path"] == "/scratch/4-ranks.plan"
    for token in (api.alice, api.bob, dave):  # neither filter opens another user's plan
        for params in ({"site": "local"}, {"scan_key": alices["scan_key"]}, {"state": "ready"}):
            items = api.get("/plans", token, params=params).json()["items"]
            assert all(plans_of(token).get(plan["id"]) == plan["path"] for plan in items)

    # Plans are shared: once bob has a campaign with the same pointing and ranks, alice's plan is his too.
    api.create(api.bob, name="b2", realizations=1)
    assert plans_of(api.bob) == {built[2]: "/scratch/2-ranks.plan", built[4]: "/scratch/4-ranks.plan"}
    assert api.get(f"/plans/{built[2]}", api.bob).status_code == 200
