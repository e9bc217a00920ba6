"""File helpers every program shares: checksums and atomic, durable writes.

They live in ``schemas/`` because checksums and whole-or-nothing files are part
of the contract between the programs (a product's ``sha256`` in
``result.json``, a plan file's checksum, an artifact's ``X-Content-SHA256``),
and because ``schemas`` is the one package that the service, the worker and the
map-maker may all import. Standard library only.

"Durable" means what a crash or a power cut cannot undo once the call returns:
the file's data are fsynced before the rename, and the folder after it, so the
new name survives as well as the bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

CHUNK_BYTES = 1 << 20  # read size for checksums: large enough for streaming, small enough for memory


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as 64 lowercase hex digits; read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder by name (a folder's fsync makes the names in it durable)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def partial_name(path: Path) -> Path:
    """A unique hidden sibling of ``path`` to write before renaming onto it."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], *, mode: int | None = None) -> None:
    """Write ``path`` whole or not at all: ``write(handle)`` fills a temporary sibling opened in
    binary mode, which is fsynced, renamed onto ``path``, and the folder fsynced. Readers see the old
    file or the new one, never a part. ``mode`` sets the permission bits (default: as created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_name(path)
    try:
        with open(partial, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        _rename_durably(partial, path, mode=mode)
    finally:
        partial.unlink(missing_ok=True)


def move_into_place(written: str | Path, path: str | Path, *, mode: int | None = None) -> None:
    """Put a file written elsewhere (a body streamed to a temporary file on the same file system) at ``path``,
    as :func:`atomic_write` ends: its data fsynced, renamed onto ``path``, the folder fsynced."""
    fsync_path(written)
    _rename_durably(Path(written), Path(path), mode=mode)


def _rename_durably(partial: Path, path: Path, *, mode: int | None) -> None:
    if mode is not None:
        os.chmod(partial, mode)
    os.replace(partial, path)
    fsync_path(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int | None = None) -> None:
    """:func:`atomic_write` of ``data``."""
    atomic_write(path, lambda handle: handle.write(data), mode=mode)


def atomic_write_text(path: str | Path, text: str, *, mode: int | None = None) -> None:
    """:func:`atomic_write` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode(), mode=mode)


def atomic_write_json(path: str | Path, data: Any, *, indent: int | None = 1) -> None:
    """:func:`atomic_write` of ``data`` as JSON, with a final newline."""
    atomic_write_text(path, json.dumps(data, indent=indent) + "\n")
