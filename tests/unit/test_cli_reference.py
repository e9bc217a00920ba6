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


def test_the_products_table_stars_unreliable_f_b_bins():
    """F_b above 2 nside, or with a Monte Carlo error above 20% (BB on a masked sky), is starred; TT is not."""
    from mapcampaign.cli.products import _corrections

    bins = {"ell_lo": [2, 18, 34], "ell_hi": [17, 33, 49], "reliable": [True, True, False]}
    transfer = {name: {"value": [0.98, 1.01, 1.2], "error": [0.05, 0.01, 0.3]} for name in ("TT", "EE", "TE", "EB", "TB")}
    transfer["BB"] = {"value": [-32464.0, 1.02, 1.0], "error": [9000.0, 0.02, 0.5]}
    lines = _corrections({"n": 8, "bins": bins, "transfer_function": transfer})
    assert lines[0].startswith("transfer function F_b") and "poorly determined" in lines[0]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert rows["2-17"].rstrip().endswith("-3.246e+04 ± 9e+03*") and "0.98 ± 0.05 " in rows["2-17"]
    assert "*" not in rows["18-33"] and rows["34-49"].count("*") == 3
