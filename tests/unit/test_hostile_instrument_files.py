"""The instrument-file readers against a corpus of hostile files (tests/support/hostile_files.py): each is refused
with the file and the column named, before its data (or another file's) are read, within a memory bound, and no
byte of the outside file it points at appears in the message. The same holds at submit (``resolve_files``),
and for spec files given as YAML."""

from __future__ import annotations

import hashlib
import shutil
import tracemalloc

import pytest

from campaignlib import instrument
from campaignlib.instrument import FocalPlaneFileError, check_instrument_file, resolve_files
from schemas.io import MAX_YAML_ALIAS_NODES, SpecError, parse_spec_text
from schemas.spec import CampaignSpec
from tests.support.hostile_files import (
    billion_laughs_lines,
    focal_plane_corpus,
    good_ground_schedule,
    large_focal_plane,
    leaks,
    make_secret,
    schedule_corpus,
    spec_for,
)

MEMORY_BOUND_BYTES = 50 << 20  # far below what reading a declared 10^7-row table took (860 MB)

pytestmark = pytest.mark.timeout(300)  # a hang guard only


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    secret, token = make_secret(folder / "secret")
    files = {**focal_plane_corpus(folder / "focal-planes", secret), **schedule_corpus(folder / "schedules")}
    return files, token


FOCAL_PLANE_CASES = [
    "external storage", "virtual dataset", "external link", "soft link", "extra group", "object outside the layout",
    "table is a group", "10^7 rows", "10^12 rows", "10^6 rows of zeros", "wide rows of zeros", "long names", "huge chunks", "two-dimensional table",
    "net as text", "quat as one number", "name as a number", "variable-length names", "nested record",
    "complex column", "not a table", "header aliases", "metadata too large", "sample_rate as a list",
]  # fmt: skip
SCHEDULE_CASES = [
    "ground aliases", "satellite aliases", "header too large", "site_lat as a list", "site_lat as text",
    "site_lon as a mapping", "site_lat out of range", "azmin as text", "el as json cells", "spin_period as text",
    "time mixin",
]  # fmt: skip


def peak_bytes(call):
    """Run ``call``; return its outcome (a value or the exception it raised) and the peak of traced memory."""
    tracemalloc.start()
    try:
        try:
            outcome = call()
        except Exception as error:  # noqa: BLE001 - the outcome is what the test looks at
            outcome = error
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def assert_refused(outcome, hostile, token, file):
    assert isinstance(outcome, FocalPlaneFileError), f"{hostile.path.name}: {outcome!r}"
    message = str(outcome)
    assert outcome.column == hostile.column and hostile.words in message, message
    assert repr(file) in message
    assert not leaks(message, token)


def test_the_corpus_is_the_whole_corpus(corpus):
    files, _token = corpus
    assert sorted(files) == sorted(FOCAL_PLANE_CASES + SCHEDULE_CASES)


@pytest.mark.parametrize("case", FOCAL_PLANE_CASES + SCHEDULE_CASES)
def test_a_hostile_upload_is_refused_naming_the_column_within_a_memory_bound(corpus, case):
    files, token = corpus
    hostile = files[case]
    outcome, peak = peak_bytes(lambda: check_instrument_file(hostile.path, kind=hostile.kind, file="uploaded"))
    assert_refused(outcome, hostile, token, "uploaded")
    assert peak < MEMORY_BOUND_BYTES, f"{case}: {peak / 1e6:.1f} MB"


@pytest.mark.parametrize("case", FOCAL_PLANE_CASES + SCHEDULE_CASES)
def test_a_hostile_file_under_the_instrument_root_is_refused_at_submit(corpus, case, tmp_path):
    files, token = corpus
    hostile = files[case]
    target = tmp_path / "root" / "site" / hostile.path.name
    target.parent.mkdir(parents=True)
    shutil.copyfile(hostile.path, target)
    sha = hashlib.sha256(target.read_bytes()).hexdigest()
    spec = CampaignSpec.model_validate(spec_for(hostile, f"site/{target.name}", sha))
    outcome, peak = peak_bytes(lambda: resolve_files(spec, tmp_path / "root"))
    assert_refused(outcome, hostile, token, f"site/{target.name}")
    assert peak < MEMORY_BOUND_BYTES, f"{case}: {peak / 1e6:.1f} MB"


def test_a_large_focal_plane_is_checked_over_its_first_rows_only(tmp_path):
    """10^6 declared detectors, the first 10,000 real and the rest zeros (which no check passes): the upload
    check reads the 10,000 and accepts the file; a selection by name looks through all of them a block at a
    time. Both within the memory bound."""
    path = large_focal_plane(tmp_path / "large.h5")
    assert path.stat().st_size < 2 << 20
    count, peak = peak_bytes(lambda: check_instrument_file(path, kind="focal-plane", file="large.h5"))
    assert count == 10**6 and peak < MEMORY_BOUND_BYTES, (count, peak)

    from schemas.spec import DetectorSelection

    table, peak = peak_bytes(
        lambda: instrument.read_focal_plane_file(path, file="large.h5", selection=DetectorSelection(names="D99*"))
    )
    assert [d.name for d in table.detectors][:3] == ["D99", "D990", "D991"] and len(table.detectors) == 111
    assert peak < MEMORY_BOUND_BYTES, peak


def test_a_schedule_with_too_many_rows_or_bytes_is_refused_before_astropy_reads_it(tmp_path, monkeypatch):
    path = good_ground_schedule(tmp_path / "long.ecsv", scans=12)
    monkeypatch.setattr(instrument, "MAX_SCHEDULE_ROWS", 10)
    with pytest.raises(FocalPlaneFileError, match="holds 12 rows, more than 10"):
        check_instrument_file(path, kind="ground-schedule", file="long.ecsv")
    monkeypatch.setattr(instrument, "MAX_SCHEDULE_BYTES", path.stat().st_size - 1)
    with pytest.raises(FocalPlaneFileError, match=f"is larger than {path.stat().st_size - 1} bytes"):
        check_instrument_file(path, kind="ground-schedule", file="long.ecsv")
    path.write_bytes(path.read_bytes().replace(b"f1", b"\xff\xfe"))
    monkeypatch.undo()
    with pytest.raises(FocalPlaneFileError, match="not UTF-8"):
        check_instrument_file(path, kind="ground-schedule", file="long.ecsv")


def test_toast_files_with_their_own_aliases_are_read(tmp_path):
    """TOAST's headers alias a unit (``&id001`` / ``*id001``): a few nodes, within the bound."""
    path = good_ground_schedule(tmp_path / "good.ecsv")
    assert "*id001" in path.read_text()
    assert check_instrument_file(path, kind="ground-schedule", file="good.ecsv") == 2


def test_a_yaml_spec_with_nested_aliases_is_refused_and_a_small_alias_is_read():
    bomb = "\n".join(billion_laughs_lines()[3:]).replace("  l", "l")
    outcome, peak = peak_bytes(lambda: parse_spec_text(bomb, ".yaml", "bomb.yaml"))
    assert isinstance(outcome, SpecError) and f"more than {MAX_YAML_ALIAS_NODES} nodes" in str(outcome), outcome
    assert peak < MEMORY_BOUND_BYTES
    with pytest.raises(SpecError, match="contains it"):
        parse_spec_text("name: &a [*a]\n", ".yaml", "loop.yaml")
    with pytest.raises(SpecError, match="not valid YAML"):
        parse_spec_text("[" * 100_000, ".yaml", "deep.yaml")
    # An alias of a scalar: the spec is read as usual (and then validated, a field at a time).
    with pytest.raises(SpecError) as caught:
        parse_spec_text("name: &n demo\nrealizations: *n\n", ".yaml", "small.yaml")
    assert "realizations" in str(caught.value)


@pytest.mark.parametrize("kind", ["focal-plane", "ground-schedule", "satellite-schedule"])
def test_randomly_damaged_files_are_refused_and_never_crash_the_reader(tmp_path, kind):
    """A few hundred seeded corruptions of a good file (bytes changed; YAML and CSV punctuation put into a
    schedule): each is read or refused with a FocalPlaneFileError, never another exception (a 500 at the
    service). h5py raises RuntimeError and astropy IndexError on some of these."""
    import random

    from tests.support.hostile_files import good_focal_plane, good_satellite_schedule

    makers = {"focal-plane": good_focal_plane, "ground-schedule": good_ground_schedule, "satellite-schedule": good_satellite_schedule}
    good = makers[kind](tmp_path / ("good.h5" if kind == "focal-plane" else "good.ecsv")).read_bytes()
    rng = random.Random(34)
    damaged = tmp_path / f"damaged{'.h5' if kind == 'focal-plane' else '.ecsv'}"
    refused = 0
    for _ in range(300):
        content = bytearray(good)
        for _ in range(rng.choice([1, 2, 4, 16])):
            at = rng.randrange(len(content))
            if kind == "focal-plane" or rng.random() < 0.5:
                content[at] = rng.randrange(256)
            else:
                content[at : at + 1] = rng.choice([b" ", b"\n", b"#", b"-", b":", b"[", b"{", b"&a ", b"*a", b"!", b'"', b"0"])
        damaged.write_bytes(bytes(content))
        try:
            check_instrument_file(damaged, kind=kind, file="damaged")
        except FocalPlaneFileError:
            refused += 1
    assert refused > 30  # the corruptions reach the checks
