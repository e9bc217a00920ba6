"""Hostile instrument files through the real API, on SQLite and PostgreSQL: uploaded (``POST /instrument-files``)
and named by a campaign from under the instrument_root (``POST /campaigns``), each is a 422 naming the field and
the column; nothing is stored (no file under uploads/, no campaign); no byte of the secret file a hostile file
points at appears in any answer, body or header; and the service's memory stays within a bound.

The corpus is tests/support/hostile_files.py; the readers' own tests are tests/unit/test_hostile_instrument_files.py.
"""

from __future__ import annotations

import hashlib
import shutil
import tracemalloc

import pytest

from tests.support.hostile_files import focal_plane_corpus, leaks, make_secret, schedule_corpus, spec_for

MEDIA_TYPES = {"focal-plane": "application/x-hdf5", "ground-schedule": "text/x-ecsv", "satellite-schedule": "text/x-ecsv"}
MEMORY_BOUND_BYTES = 50 << 20  # the service's traced memory over both requests (the 10^7-row table took 860 MB)
CASES = [
    "external storage", "virtual dataset", "external link", "soft link", "extra group", "object outside the layout",
    "10^7 rows", "10^12 rows", "10^6 rows of zeros", "wide rows of zeros", "huge chunks", "net as text", "variable-length names",
    "nested record", "header aliases", "sample_rate as a list",
    "ground aliases", "satellite aliases", "header too large", "site_lat as a list", "site_lat as text",
    "site_lon as a mapping", "azmin as text", "el as json cells", "spin_period as text", "time mixin",
]  # fmt: skip

pytestmark = pytest.mark.timeout(300)  # a hang guard only


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    secret, token = make_secret(folder / "secret")
    return {**focal_plane_corpus(folder / "focal-planes", secret), **schedule_corpus(folder / "schedules")}, token


def assert_refused(answer, hostile, token, loc, file):
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    assert problem["loc"] == loc
    assert hostile.words in problem["msg"] and repr(file) in problem["msg"], problem["msg"]
    if hostile.column:
        assert f"column {hostile.column!r}" in problem["msg"]
    assert not leaks(answer.text, token)
    assert not any(leaks(f"{name}: {value}", token) for name, value in answer.headers.items())


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_file_is_refused_at_upload_and_at_submit_and_nothing_is_stored(make_api, tmp_path, corpus, case):
    files, token = corpus
    hostile = files[case]
    root = tmp_path / "instruments"
    (root / "site").mkdir(parents=True)
    api = make_api(instrument_root=root)
    content = hostile.path.read_bytes()
    sha = hashlib.sha256(content).hexdigest()
    suffix = ".h5" if hostile.kind == "focal-plane" else ".ecsv"
    shutil.copyfile(hostile.path, root / "site" / f"hostile{suffix}")

    tracemalloc.start()
    try:
        upload = api.post(
            "/instrument-files", params={"kind": hostile.kind}, content=content, headers={"Content-Type": MEDIA_TYPES[hostile.kind]}
        )
        submit = api.post("/campaigns", json=spec_for(hostile, f"site/hostile{suffix}", sha))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert_refused(upload, hostile, token, ["body"], f"uploads/{sha}{suffix}")
    field = "focal_plane" if hostile.kind == "focal-plane" else "scan"
    assert_refused(submit, hostile, token, ["body", field, "file"], f"site/hostile{suffix}")
    assert peak < MEMORY_BOUND_BYTES, f"{case}: {peak / 1e6:.1f} MB"

    uploads = root / "uploads"
    assert not uploads.exists() or list(uploads.iterdir()) == []  # neither the file nor a temporary one
    assert api.get("/campaigns").json()["items"] == []
