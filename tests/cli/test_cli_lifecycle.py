"""extend, clone and delete from the command line, against a live service (SQLite)."""

from __future__ import annotations

import json

from tests.cli.conftest import drive_campaign, run_cli, stdout_json
from tests.support.worker_helpers import tiny_spec


def submitted_id(env, tmp_path, name: str, realizations: int = 1) -> int:
    spec = tmp_path / f"{name}.json"
    spec.write_text(json.dumps(tiny_spec(name, realizations=realizations)))
    done = run_cli(env, "submit", "--json", str(spec))
    assert done.returncode == 0, done.stderr
    return int(stdout_json(done)[0]["campaign_id"])


def test_extend_clone_and_delete(fresh_user, cli_service, tmp_path):
    campaign_id = submitted_id(fresh_user, tmp_path, "lifecycle")
    drive_campaign(cli_service, campaign_id, name="lifecycle")

    extended = run_cli(fresh_user, "extend", str(campaign_id), "2")
    assert extended.returncode == 0, extended.stderr
    assert f"campaign {campaign_id}: 2 realisation(s) added, 3 in all" in extended.stdout
    drive_campaign(cli_service, campaign_id, name="lifecycle")
    status = stdout_json(run_cli(fresh_user, "status", "--json", str(campaign_id)))
    assert (status["state"], status["progress"]["counts"]["succeeded"]) == ("succeeded", 3)

    cloned = run_cli(fresh_user, "clone", "--json", str(campaign_id), "--set", "max_attempts=5", "--name", "copy")
    assert cloned.returncode == 0, cloned.stderr
    clone = stdout_json(cloned)
    assert (clone["name"], clone["max_attempts"], clone["realizations"]) == ("copy", 5, 3)
    assert clone["scan_key"] == status["scan_key"] and clone["id"] != campaign_id

    bad = run_cli(fresh_user, "clone", str(campaign_id), "--set", "pixelization.nside=true")
    assert bad.returncode == 2
    assert "changes.pixelization.nside" in bad.stderr
    malformed = run_cli(fresh_user, "clone", str(campaign_id), "--set", "nside")
    assert malformed.returncode == 2 and "FIELD.PATH=VALUE" in malformed.stderr

    unconfirmed = run_cli(fresh_user, "delete", str(campaign_id))  # no terminal: --yes is required
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    running = run_cli(fresh_user, "delete", "--yes", str(clone["id"]))
    assert running.returncode == 2 and "cancel" in running.stderr
    deleted = run_cli(fresh_user, "delete", "--yes", str(campaign_id))
    assert deleted.returncode == 0, deleted.stderr
    gone = run_cli(fresh_user, "extend", str(campaign_id), "1")
    assert gone.returncode == 2 and "no such campaign" in gone.stderr


def test_a_held_campaign_is_shown_with_its_reason_and_released_by_retry(fresh_user, cli_service, tmp_path):
    spec = tmp_path / "held.json"
    spec.write_text(json.dumps(tiny_spec("held", realizations=4, max_attempts=1, hold_after_failures=2)))
    campaign_id = int(stdout_json(run_cli(fresh_user, "submit", "--json", str(spec)))[0]["campaign_id"])
    drive_campaign(cli_service, campaign_id, fail_indexes={0, 1, 2, 3}, name="held")  # stops when nothing is handed out

    watched = run_cli(fresh_user, "watch", "--quiet", str(campaign_id))
    assert watched.returncode == 1, watched.stderr
    assert f"campaign {campaign_id} held: 0 succeeded, 2 failed" in watched.stdout
    assert "failed alike (app_error: Traceback: boom)" in watched.stdout
    status = run_cli(fresh_user, "status", str(campaign_id))
    assert "state        held (held: the last 2 attempts failed alike" in status.stdout
    assert f"`mapcampaign retry {campaign_id}` releases it" in status.stdout

    released = run_cli(fresh_user, "retry", str(campaign_id))
    assert released.returncode == 0, released.stderr
    assert f"campaign {campaign_id}: 2 failed realisation(s) queued again; queued" in released.stdout
    drive_campaign(cli_service, campaign_id, name="held")
    assert stdout_json(run_cli(fresh_user, "status", "--json", str(campaign_id)))["state"] == "succeeded"
