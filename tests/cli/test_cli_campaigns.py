"""submit (batch, --dry-run, idempotent re-submit, invalid files), list, status, cancel, retry, logs, plans."""

from __future__ import annotations

import json
import tomllib

import httpx

from tests.cli.conftest import drive_campaign, run_cli, stdout_json
from tests.support.worker_helpers import tiny_spec

BAD_YAML = """\
name: bad sampling
focal_plane:
  sample_rate_hz: -3
  detectors: [{name: A0}]
"""


def write_specs(folder, count=2):
    """``count`` valid specs (TOML and JSON) and one invalid YAML spec in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        spec = tiny_spec(f"batch {n}", realizations=2)
        (folder / f"good{n}.json").write_text(json.dumps(spec))
    (folder / "bad.yaml").write_text(BAD_YAML)
    (folder / "notes.txt").write_text("not a spec: ignored in a folder")
    return folder


def campaigns_of(env) -> list[dict]:
    answer = httpx.get(
        env["MAPCAMPAIGN_SERVER"] + "/api/v1/campaigns", headers={"Authorization": f"Bearer {env['MAPCAMPAIGN_TOKEN']}"}
    )
    answer.raise_for_status()
    return answer.json()["items"]


def test_batch_submit_sends_the_valid_files_and_names_the_invalid_one(fresh_user, tmp_path):
    folder = write_specs(tmp_path / "specs")
    done = run_cli(fresh_user, "submit", str(folder))
    assert done.returncode == 2, done.stderr
    assert "bad.yaml: invalid: focal_plane.sample_rate_hz: Input should be greater than 0" in done.stderr
    submitted = [line for line in done.stdout.splitlines() if "submitted as campaign" in line]
    assert len(submitted) == 2 and all("good" in line for line in submitted), done.stdout
    assert sorted(c["name"] for c in campaigns_of(fresh_user)) == ["batch 0", "batch 1"]


def test_submit_json_output_parses_and_names_the_outcome_of_each_file(fresh_user, tmp_path):
    folder = write_specs(tmp_path / "specs", count=1)
    done = run_cli(fresh_user, "submit", "--json", str(folder / "good0.json"), str(folder / "bad.yaml"))
    assert done.returncode == 2
    records = {record["file"].rsplit("/", 1)[-1]: record for record in stdout_json(done)}
    assert records["good0.json"]["outcome"] == "submitted" and records["good0.json"]["campaign_id"] >= 1
    assert records["bad.yaml"]["outcome"] == "invalid"
    assert records["bad.yaml"]["problems"] == [
        {"field": "focal_plane.sample_rate_hz", "reason": "Input should be greater than 0"}
    ]


def test_dry_run_validates_and_stores_nothing(fresh_user, tmp_path):
    folder = write_specs(tmp_path / "specs")
    (folder / "bad.yaml").unlink()
    done = run_cli(fresh_user, "submit", "--dry-run", str(folder))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("dry run, nothing stored") == 2
    assert campaigns_of(fresh_user) == []
    invalid = run_cli(fresh_user, "submit", "--dry-run", str(tmp_path / "missing.toml"))
    assert invalid.returncode == 2 and "missing.toml: invalid: no such file or folder" in invalid.stderr


def test_resubmitting_the_same_file_makes_no_second_campaign(fresh_user, tmp_path):
    spec_file = tmp_path / "one.toml"
    spec_file.write_text('name = "once"\nrealizations = 2\n[focal_plane]\ndetectors = [{ name = "A0" }]\n')
    first = stdout_json(run_cli(fresh_user, "submit", "--json", str(spec_file)))
    again = stdout_json(run_cli(fresh_user, "submit", "--json", str(spec_file)))
    assert first[0]["outcome"] == "submitted" and again[0]["outcome"] == "replayed"
    assert first[0]["campaign_id"] == again[0]["campaign_id"]
    assert [c["id"] for c in campaigns_of(fresh_user)] == [first[0]["campaign_id"]]
    # --new asks for a second campaign on purpose
    forced = stdout_json(run_cli(fresh_user, "submit", "--json", "--new", str(spec_file)))
    assert forced[0]["outcome"] == "submitted" and forced[0]["campaign_id"] != first[0]["campaign_id"]


def test_list_status_cancel_and_json_output(fresh_user, tmp_path):
    spec_file = tmp_path / "status.toml"
    spec_file.write_text('name = "to cancel"\nrealizations = 3\n[focal_plane]\ndetectors = [{ name = "A0" }]\n')
    campaign_id = stdout_json(run_cli(fresh_user, "submit", "--json", str(spec_file)))[0]["campaign_id"]

    listed = stdout_json(run_cli(fresh_user, "list", "--json"))
    assert [(c["id"], c["state"]) for c in listed] == [(campaign_id, "queued")]
    table = run_cli(fresh_user, "list")
    assert table.returncode == 0 and "to cancel" in table.stdout

    status = stdout_json(run_cli(fresh_user, "status", "--json", str(campaign_id)))
    assert status["id"] == campaign_id and status["progress"]["counts"]["queued"] == 3
    text = run_cli(fresh_user, "status", str(campaign_id))
    assert "queued 3" in text.stdout

    cancelled = stdout_json(run_cli(fresh_user, "cancel", "--json", str(campaign_id), "--reason", "test"))
    assert cancelled["state"] == "cancelled" and cancelled["cancel_reason"] == "test"
    assert stdout_json(run_cli(fresh_user, "list", "--json", "--state", "cancelled"))[0]["id"] == campaign_id
    refused = run_cli(fresh_user, "retry", str(campaign_id))
    assert refused.returncode == 2 and "was cancelled" in refused.stderr and "HTTP 409" in refused.stderr
    again = run_cli(fresh_user, "cancel", str(campaign_id))  # what was asked for already holds
    assert again.returncode == 0 and f"campaign {campaign_id} was already cancelled (test)" in again.stdout
    assert stdout_json(run_cli(fresh_user, "cancel", "--json", str(campaign_id)))["state"] == "cancelled"


def test_unknown_campaign_bad_token_and_unreachable_service_exit_codes(fresh_user, tmp_path):
    missing = run_cli(fresh_user, "status", "999999")
    assert missing.returncode == 2 and "HTTP 404" in missing.stderr
    bad_token = run_cli({**fresh_user, "MAPCAMPAIGN_TOKEN": "not-a-token"}, "list")
    assert bad_token.returncode == 2 and "HTTP 401" in bad_token.stderr
    spec_file = tmp_path / "s.json"
    spec_file.write_text(json.dumps(tiny_spec("refused")))
    refused = run_cli({**fresh_user, "MAPCAMPAIGN_TOKEN": "not-a-token"}, "submit", str(spec_file))
    assert refused.returncode == 2 and "s.json: not submitted:" in refused.stderr and "HTTP 401" in refused.stderr
    unreachable = run_cli(fresh_user, "--server", "http://127.0.0.1:9", "submit", str(spec_file))
    assert unreachable.returncode == 1 and "s.json: not submitted: cannot reach the service" in unreachable.stderr
    nowhere = run_cli(fresh_user, "--server", "http://127.0.0.1:9", "list")
    assert nowhere.returncode == 1 and "cannot reach the service at http://127.0.0.1:9" in nowhere.stderr


def test_plans_and_logs_json(fresh_user, cli_service, tmp_path):
    spec_file = tmp_path / "logs.json"
    spec_file.write_text(json.dumps(tiny_spec("logs", realizations=1, max_attempts=1)))
    campaign_id = stdout_json(run_cli(fresh_user, "submit", "--json", str(spec_file)))[0]["campaign_id"]
    drive_campaign(cli_service, campaign_id, fail_indexes={0}, name="logs")
    logs = stdout_json(run_cli(fresh_user, "logs", "--json", str(campaign_id), "--realization", "0"))
    assert logs[0]["state"] == "failed" and logs[0]["attempts"][0]["failure_class"] == "app_error"
    text = run_cli(fresh_user, "logs", str(campaign_id))  # default: every failed realisation
    assert "Traceback: boom" in text.stdout and "exit code 1" in text.stdout
    missing = run_cli(fresh_user, "logs", str(campaign_id), "--realization", "7")
    assert missing.returncode == 2 and "HTTP 404" in missing.stderr
    assert "no such realisation" in missing.stderr and "no such campaign" not in missing.stderr
    plans = stdout_json(run_cli(fresh_user, "plans", "--json"))
    assert any(plan["state"] == "ready" for plan in plans)
    retried = stdout_json(run_cli(fresh_user, "retry", "--json", str(campaign_id)))
    assert retried["requeued"] == 1 and retried["campaign"]["state"] in ("queued", "running")


def test_bundled_examples_are_valid_specs(fresh_user):
    from schemas.io import EXAMPLE_NAMES, example_spec_text, load_example_spec

    for name in EXAMPLE_NAMES:
        assert load_example_spec(name).name
        tomllib.loads(example_spec_text(name))
