"""Paths a worker reports are held to the rules of user-supplied ones: a forged plan path is refused."""

from __future__ import annotations

import pytest

FORGED_PATHS = [
    "../../../../etc/passwd",  # relative, and leaves any folder
    "/site/plans/../../../etc/passwd",
    "plans/p.plan",  # relative: resolved in whatever folder the reader is in
    "/site/./plans/p.plan",
    "/site/plans/p.plan\n/etc/passwd",
    "C:\\site\\plans\\p.plan",
]


@pytest.mark.parametrize("path", FORGED_PATHS)
def test_a_forged_plan_path_is_refused_and_nothing_is_stored(api, path):
    api.create(realizations=1)
    worker = api.register()
    build = api.claim(worker)[0]
    answer = api.plan_built(build["task_id"], path=path)
    assert answer.status_code == 422, answer.text
    assert [problem["field"] for problem in answer.json()["detail"]] == ["body.path"]
    plan = api.get(f"/plans/{build['plan_id']}").json()
    assert plan["state"] == "building" and plan["path"] is None and plan["checksum"] is None
    assert api.plan_built(build["task_id"], path="/site/plans/p.plan").status_code == 200  # the build goes on
    assert api.get(f"/plans/{build['plan_id']}").json()["path"] == "/site/plans/p.plan"
