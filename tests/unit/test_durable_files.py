"""schemas.files: whole-or-nothing writes, and a streamed file put in place the same way."""

from __future__ import annotations

import os

import pytest

from schemas.files import atomic_write_bytes, move_into_place


def test_atomic_write_replaces_the_file_whole_and_leaves_no_partial(tmp_path):
    target = tmp_path / "deep" / "file.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new", mode=0o640)
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o640
    assert sorted(path.name for path in target.parent.iterdir()) == ["file.bin"]


def test_a_streamed_file_is_moved_into_place_with_its_mode(tmp_path, monkeypatch):
    written = tmp_path / ".upload-x"
    written.write_bytes(b"streamed")
    target = tmp_path / "kept.h5"
    target.write_bytes(b"earlier")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda descriptor: synced.append(descriptor) or real_fsync(descriptor))
    move_into_place(written, target, mode=0o604)
    assert target.read_bytes() == b"streamed" and not written.exists()
    assert target.stat().st_mode & 0o777 == 0o604
    assert len(synced) == 2  # the file's data, then the folder that names it


def test_moving_a_missing_file_changes_nothing(tmp_path):
    target = tmp_path / "kept.h5"
    target.write_bytes(b"earlier")
    with pytest.raises(FileNotFoundError):
        move_into_place(tmp_path / "gone", target)
    assert target.read_bytes() == b"earlier"
