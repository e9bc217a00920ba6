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


def register_with_folder(api, data_dir: str):
    return api.wpost(
        "/workers", json={"name": "w1", "site": "local", "host": "h", "capacity": 2, "data_dir": data_dir}
    )


def test_a_plan_path_outside_the_registered_site_folder_is_refused(api):
    api.create(realizations=1)
    registered = register_with_folder(api, "/data/sites/local")
    assert registered.status_code == 200, registered.text
    build = api.claim(registered.json()["id"])[0]
    for outside in ("/etc/passwd", "/data/sites/localother/plans/p.plan", "/data/sites/plans/p.plan"):
        answer = api.plan_built(build["task_id"], path=outside)
        assert answer.status_code == 422, answer.text
        [problem] = answer.json()["detail"]
        assert problem["field"] == "body.path" and "/data/sites/local" in problem["msg"], problem
    assert api.get(f"/plans/{build['plan_id']}").json()["path"] is None
    inside = "/data/sites/local/plans/p.plan"
    assert api.plan_built(build["task_id"], path=inside).status_code == 200
    assert api.get(f"/plans/{build['plan_id']}").json()["path"] == inside


@pytest.mark.parametrize("folder", ["sites/local", "/data/../etc", "/data/\x00x"])
def test_a_registration_with_a_forged_site_folder_is_refused(api, folder):
    answer = register_with_folder(api, folder)
    assert answer.status_code == 422, answer.text
    assert [problem["field"] for problem in answer.json()["detail"]] == ["body.data_dir"]
