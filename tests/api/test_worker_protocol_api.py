"""Service additions the site worker needs: invalidating a refused plan, and the exit of a cancelled attempt."""

from __future__ import annotations

from service.auth.service import create_token


def _realize(api, worker: int) -> tuple[dict, dict]:
    build = api.build_plan(worker)
    tasks = api.claim(worker, max_tasks=1)
    assert [t["kind"] for t in tasks] == ["realize"]
    return build, tasks[0]


def test_refused_plan_is_invalidated_and_built_again_with_a_fresh_budget(make_api):
    api = make_api(max_plan_builds=1)
    campaign = api.create(realizations=2)
    worker = api.register()
    build, task = _realize(api, worker)
    plan_id = build["plan_id"]

    body = {"task_id": task["task_id"], "checksum": "sha256:abc", "reason": "mapmaker realize: plan checksum mismatch"}
    answer = api.wpost(f"/plans/{plan_id}/invalid", json=body)
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["state"] == "failed" and plan["build_attempts"] == 0
    assert "checksum mismatch" in plan["last_error"] and "w1" in plan["last_error"]
    # Idempotent: a second refusal of the same plan changes nothing.
    again = api.wpost(f"/plans/{plan_id}/invalid", json=body)
    assert again.status_code == 200 and again.json()["last_error"] == plan["last_error"]

    # The attempt that refused it is reported failed; nothing runs until the plan is rebuilt,
    # and the rebuild is allowed although max_plan_builds (1) builds were already used.
    assert api.fail(task["task_id"], "app_error", 3).json()["state"] == "queued"
    rebuild = api.claim(worker, max_tasks=5)
    assert [(t["kind"], t["plan_id"]) for t in rebuild] == [("preprocess", plan_id)]
    assert rebuild[0]["build_attempt"] == 2
    assert api.plan_built(rebuild[0]["task_id"], path="/plans/rebuilt.plan").status_code == 200
    realize = api.claim(worker, max_tasks=5)
    assert sorted(t["realization"] for t in realize) == [0, 1]
    assert {t["plan"]["path"] for t in realize} == {"/plans/rebuilt.plan"}
    assert api.campaign(campaign["id"])["state"] == "running"

    events = api.get("/events/log").json()
    invalidated = [e for e in events if e["kind"] == "plan" and e["data"].get("invalidated")]
    assert len(invalidated) == 1 and invalidated[0]["state"] == "failed"


def test_plan_invalid_needs_a_held_task_with_that_plan_and_a_matching_checksum(api):
    api.create(realizations=2)
    worker = api.register()
    build, task = _realize(api, worker)
    plan_id = build["plan_id"]

    def invalid(plan: int, token: str | None = None, **changes):
        body = {"task_id": task["task_id"], "checksum": "sha256:abc", "reason": "refused", **changes}
        return api.wpost(f"/plans/{plan}/invalid", token, json=body)

    assert invalid(plan_id, api.alice).status_code == 403  # user token
    assert invalid(plan_id, api.bob_worker).status_code == 403  # not the task holder
    assert invalid(plan_id, task_id=build["task_id"]).status_code == 422  # a preprocess task
    assert invalid(plan_id, task_id="realize-999").status_code == 404
    assert invalid(999).status_code == 422  # the task was given another plan
    # A checksum that is not the plan's (rebuilt since): left alone.
    assert invalid(plan_id, checksum="sha256:old").json()["state"] == "ready"
    assert api.get(f"/plans/{plan_id}").json()["state"] == "ready"
    # A task that is no longer held cannot invalidate.
    assert api.fail(task["task_id"]).status_code == 200
    assert invalid(plan_id).status_code == 409
    assert api.get(f"/plans/{plan_id}").json()["state"] == "ready"


def test_report_of_a_cancelled_attempt_keeps_its_exit_code_and_log_tail(api):
    campaign = api.create(realizations=2)
    worker = api.register()
    _, task = _realize(api, worker)
    assert api.wpost(f"/tasks/{task['task_id']}/started", json={"host": "node1"}).status_code == 200
    assert api.post(f"/campaigns/{campaign['id']}/cancel", json={"reason": "enough"}).status_code == 200

    beat = api.wpost(f"/workers/{worker}/heartbeat", json={"running": [task["task_id"]]}).json()
    assert beat["cancel"] == [task["task_id"]]
    report = {"failure_class": "cancelled", "exit_code": 143, "log_tail": "worker.runner: cancelled"}
    answer = api.wpost(f"/tasks/{task['task_id']}/failed", json=report)
    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    # Recorded once: a repeat changes nothing.
    repeat = api.wpost(f"/tasks/{task['task_id']}/failed", json={**report, "exit_code": 1, "log_tail": "other"})
    assert repeat.status_code == 200
    attempt = api.realization(campaign["id"], task["realization"])["attempt_history"][-1]
    assert attempt["failure_class"] == "cancelled" and attempt["exit_code"] == 143
    assert attempt["log_tail"] == "worker.runner: cancelled"
    # Only as a cancelled report, and only from the holder's token.
    assert api.fail(task["task_id"], "app_error").status_code == 409
    assert api.wpost(f"/tasks/{task['task_id']}/failed", api.bob_worker, json=report).status_code == 403


def test_another_users_worker_token_cannot_take_over_a_worker_name(api):
    """Found by review: registering a known name with any worker token moved the worker, and so its tasks,
    to that token. The same user's new token (rotation) still may; another user's gets 409."""
    worker = api.register("w1")
    api.create(realizations=1)
    build = api.claim(worker)[0]
    answer = api.wpost("/workers", api.bob_worker, json={"name": "w1", "site": "local", "host": "x", "capacity": 1})
    assert answer.status_code == 409 and answer.json()["code"] == "worker_name_taken"
    beat = api.wpost(f"/workers/{worker}/heartbeat", json={"running": [build["task_id"]]})
    assert beat.status_code == 200 and beat.json()["lost"] == []  # the owner is not locked out
    with api.database.session() as session:
        rotated = create_token(session=session, user_name="alice", kind="worker")
        session.commit()
    assert api.register("w1", token=rotated) == worker  # a restart with a rotated token keeps its id
