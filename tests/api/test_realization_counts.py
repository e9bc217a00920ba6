"""The per-state counts the database keeps (migration 0005) agree with the realisations, whatever changed them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from service.campaigns.models import Realization, RealizationCount


def counted(api: Any) -> tuple[dict[tuple[int, str], int], dict[tuple[int, str], int]]:
    """(kept counts without zeros, counts made by GROUP BY over the realisations)."""
    with api.database.session(write=False) as session:
        kept = {
            (campaign_id, str(state)): count
            for campaign_id, state, count in session.execute(
                select(RealizationCount.campaign_id, RealizationCount.state, RealizationCount.count)
            )
            if count
        }
        scanned = {
            (campaign_id, str(state)): count
            for campaign_id, state, count in session.execute(
                select(Realization.campaign_id, Realization.state, func.count()).group_by(
                    Realization.campaign_id, Realization.state
                )
            )
        }
    return kept, scanned


def test_kept_counts_follow_every_change_of_state(api):
    first = api.create(realizations=30, max_attempts=1)
    second = api.create(realizations=5)
    worker = api.register(capacity=50)
    api.build_plan(worker)
    tasks = api.claim(worker, max_tasks=12)
    assert [task["kind"] for task in tasks] == ["realize"] * 12
    for task in tasks[:4]:
        assert api.wpost(f"/tasks/{task['task_id']}/started", json={"host": "h"}).status_code == 200
        assert api.succeed(task).status_code == 200
    for task in tasks[4:6]:
        assert api.fail(task["task_id"]).status_code == 200
    kept, scanned = counted(api)
    assert kept == scanned
    assert kept[(first["id"], "succeeded")] == 4 and kept[(first["id"], "failed")] == 2
    status = api.campaign(first["id"])["progress"]["counts"]
    assert status["claimed"] == 6 and status["queued"] == 18 and status["succeeded"] == 4

    assert api.post(f"/campaigns/{first['id']}/retry").status_code == 200
    assert api.post(f"/campaigns/{first['id']}/cancel", json={"reason": "enough"}).status_code == 200
    kept, scanned = counted(api)
    assert kept == scanned and kept[(first["id"], "succeeded")] == 4
    assert api.campaign(first["id"])["progress"]["counts"]["cancelled"] == 26

    assert api.request("DELETE", f"/campaigns/{first['id']}", api.alice).status_code == 204
    kept, scanned = counted(api)
    assert kept == scanned == {(second["id"], "queued"): 5}
