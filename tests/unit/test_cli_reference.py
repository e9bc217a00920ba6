"""The CLI's pure parts: the spec reference page is what the models say; 422 answers become field paths;
spec files and idempotency keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from mapcampaign.cli._client import field_problems
from mapcampaign.cli.campaigns import describe_outcome, spec_files
from mapcampaign.client import spec_file_key as idempotency_key

REPO = Path(__file__).resolve().parents[2]


def test_spec_reference_page_is_up_to_date():
    page = REPO / "docs" / "reference" / "spec.md"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "spec-reference"), "--check", str(page)],
        check=False, capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_spec_reference_names_every_section_and_field():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "spec-reference")], check=False, capture_output=True, text=True)
    text = done.stdout
    for heading in (
        "#### Top level",
        '#### `[scan]` with `kind = "satellite"`',
        '#### `[scan]` with `kind = "ground"`',
        "#### `[[focal_plane.detectors]]`",
        '#### `[sky]` with `kind = "map"`',
        "#### `[noise]`",
        "#### `[resources]`",
    ):
        assert heading in text
    assert "| `f_knee_hz` | float, Hz | `0` | >= 0, <= 1000 |" in text
    assert "| `name` | str | **required** |" in text


def test_422_answer_becomes_spec_field_paths():
    answer = httpx.Response(
        422,
        json={
            "detail": [
                {"field": "body.focal_plane.detectors.0.name", "loc": ["body", "focal_plane", "detectors", 0, "name"],
                 "msg": "String should match pattern", "type": "string_pattern_mismatch"},
                {"field": "body", "loc": ["body"], "msg": "Field required", "type": "missing"},
            ],
            "code": "invalid_request",
        },
    )
    assert field_problems(answer) == [
        ("focal_plane.detectors.0.name", "String should match pattern"),
        ("", "Field required"),
    ]


def test_spec_files_expand_folders_and_name_what_is_missing(tmp_path):
    (tmp_path / "b.yaml").write_text("x")
    (tmp_path / "a.toml").write_text("x")
    (tmp_path / "readme.txt").write_text("x")
    files, problems = spec_files([tmp_path, tmp_path / "nope.json"])
    assert [p.name for p in files] == ["a.toml", "b.yaml"]
    assert describe_outcome(problems[0]) == f"{tmp_path / 'nope.json'}: invalid: no such file or folder"


def test_idempotency_key_follows_the_file_bytes():
    assert idempotency_key(b"a") == idempotency_key(b"a") != idempotency_key(b"b")
    assert len(idempotency_key(b"a")) <= 200
