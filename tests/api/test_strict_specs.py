"""Specs are strict over REST as in files: a boolean or a numeric string is not a number, and an unknown field
is answered with a close match. The 422 names the field; nothing is stored."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.service_helpers import spec_data


@pytest.mark.parametrize(
    "section, field, value, message",
    [
        ("pixelization", "nside", True, "Input should be a number, not a boolean (True)"),
        ("pixelization", "nside", "16", "Input should be a number, not a string ('16')"),
        ("focal_plane", "sample_rate_hz", True, "Input should be a number, not a boolean (True)"),
    ],
)
def test_a_number_given_as_a_boolean_or_a_string_is_refused_naming_the_field(api, section, field, value, message):
    data = spec_data()
    data[section] = {**data.get(section, {}), field: value}
    before = api.get("/campaigns").json()["items"]
    answer = api.post("/campaigns", json=data)
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["body", section, field] and problem["msg"] == message
    assert api.get("/campaigns").json()["items"] == before  # nothing stored


def test_an_unknown_field_gets_a_did_you_mean(api):
    data = spec_data()
    data["realisations"] = data.pop("realizations")
    answer = api.post("/campaigns", json=data)
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["body", "realisations"]
    assert problem["msg"] == "unknown field; did you mean 'realizations'?"
    assert api.get("/campaigns").json()["items"] == []


def test_the_cli_refuses_the_same_spec_with_exit_2(tmp_path):
    spec = tmp_path / "typo.toml"
    spec.write_text('name = "x"\nrealisations = 3\n[pixelization]\nnside = true\n[focal_plane]\ndetectors = [{ name = "A" }]\n')
    done = subprocess.run(
        [sys.executable, "-c", "from mapcampaign.cli import main; main()", "submit", "--dry-run", str(spec)],
        check=False, capture_output=True, text=True, timeout=120, env={"MAPCAMPAIGN_DATA_DIR": str(tmp_path / "data"),
                                                                     "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done.stderr
    assert "pixelization.nside: Input should be a number, not a boolean (True)" in done.stderr
    assert "realisations: unknown field; did you mean 'realizations'?" in done.stderr
