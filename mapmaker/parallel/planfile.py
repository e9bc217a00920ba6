"""The overlap-plan file: one binary file per (scan key, rank count), each rank reading only its part.

Layout (format version 1; little-endian; offsets in bytes)::

    0      fixed header, 96 bytes (struct ``HEADER``):
             magic "MCOVPLAN" | format version u32 | ranks u32 |
             table offset u64 | JSON offset u64 | JSON length u64 |
             data offset u64 | file size u64 | reserved u64 |
             header sha256 (32 bytes)
    96     index table: one 48-byte entry per rank:
             section offset u64 (from the data offset) | section length u64 | section sha256 (32)
    ...    JSON header (UTF-8): format_version, scan_key, ranks, decomposition
           (fingerprint), npix, nside, buffer_pixels, table_sha256, created,
           mapmaker version, small overlap figures
    data   (64-byte aligned) one section per rank, 64-byte aligned each:
             magic "MCOVRANK" | rank u32 | number of arrays u32 |
             element count u64 per array |
             the arrays of :data:`mapmaker.parallel.overlap.PLAN_ARRAYS`, in that order,
             each padded to 8 bytes

The header sha256 covers the fixed header (with the checksum field zeroed)
and the JSON, which holds the sha256 of the index table, which holds every
section's sha256: it names the whole content. A rank verifies the header,
its own table entry and its own section; rank 0 also verifies the table.
A truncated file fails the size check on every rank.

Writing is collective (MPI-IO: each rank writes its section at its offset,
rank 0 the header and table) into a temporary sibling that is renamed over
the destination only when complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from mapmaker.parallel.overlap import PLAN_ARRAYS, OverlapPlan
from schemas.files import fsync_path

PLAN_FORMAT_VERSION = 1
MAGIC = b"MCOVPLAN"
SECTION_MAGIC = b"MCOVRANK"
HEADER = struct.Struct("<8sIIQQQQQQ32s")  # 96 bytes
ENTRY = struct.Struct("<QQ32s")  # 48 bytes
SECTION_PREAMBLE = struct.Struct("<8sII")
ALIGN = 64
WRITE_PIECE = 1 << 30  # bytes per MPI-IO call: counts stay below 2**31


class PlanRefused(Exception):
    """The plan does not belong to this run, or is damaged. Never rebuilt silently (exit code 3)."""


@dataclass(frozen=True)
class PlanIdentity:
    """What a plan must match: the run's scan key, rank count and decomposition fingerprint."""

    scan_key: str
    ranks: int
    decomposition: str


def _align(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def section_bytes(plan: OverlapPlan) -> bytes:
    """The bytes of one rank's section (see the module docstring)."""
    arrays = [np.ascontiguousarray(getattr(plan, name), dtype=dtype) for name, dtype in PLAN_ARRAYS.items()]
    parts = [SECTION_PREAMBLE.pack(SECTION_MAGIC, plan.rank, len(arrays)), struct.pack(f"<{len(arrays)}Q", *(a.size for a in arrays))]
    for array in arrays:
        data = array.tobytes()
        parts.append(data + b"\0" * (_align(len(data), 8) - len(data)))
    return b"".join(parts)


def parse_section(data: bytes, rank: int, size: int, npix: int) -> OverlapPlan:
    """An :class:`OverlapPlan` from a verified section's bytes; structural checks raise PlanRefused."""
    preamble = SECTION_PREAMBLE.size
    magic, section_rank, n_arrays = SECTION_PREAMBLE.unpack_from(data, 0)
    if magic != SECTION_MAGIC or section_rank != rank or n_arrays != len(PLAN_ARRAYS):
        raise PlanRefused(f"section of rank {rank} is malformed (magic, rank or array count)")
    counts = struct.unpack_from(f"<{n_arrays}Q", data, preamble)
    offset = preamble + 8 * n_arrays
    arrays: dict[str, Any] = {}  # OverlapPlan's array fields by name (Any: the dataclass has other fields too)
    for (name, dtype), count in zip(PLAN_ARRAYS.items(), counts, strict=True):
        nbytes = count * np.dtype(dtype).itemsize
        if offset + nbytes > len(data):
            raise PlanRefused(f"section of rank {rank} is shorter than its arrays")
        arrays[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
        offset += _align(nbytes, 8)
    plan = OverlapPlan(rank=rank, size=size, npix=npix, **arrays)
    _check_structure(plan)
    return plan


def _check_structure(plan: OverlapPlan) -> None:
    """Cheap consistency checks, so that a wrong plan fails here and not in the middle of a solve."""
    n = plan.n_local
    problems = []
    if len(plan.multiplicity) != n or len(plan.owner) != n:
        problems.append("per-pixel arrays differ in length")
    if len(plan.shared_offsets) != len(plan.neighbours) + 1 or (len(plan.shared_offsets) and plan.shared_offsets[-1] != plan.n_shared):
        problems.append("shared-list offsets do not match the lists")
    if len(plan.shared_index) and (plan.shared_index.min() < 0 or plan.shared_index.max() >= n):
        problems.append("shared indices outside the local pixels")
    if len(plan.neighbours) and (plan.neighbours.min() < 0 or plan.neighbours.max() >= plan.size or plan.rank in plan.neighbours):
        problems.append("neighbour ranks out of range")
    if n and (plan.local_pixels.min() < 0 or plan.local_pixels.max() >= plan.npix):
        problems.append("pixel ids outside the map")
    if not (len(plan.interest_low) == len(plan.interest_high) == len(plan.interest_own) == len(plan.interest_pixels)):
        problems.append("butterfly arrays differ in length")
    if problems:
        raise PlanRefused(f"section of rank {plan.rank} is inconsistent: {'; '.join(problems)}")


# --------------------------------------------------------------------------- writing (collective)


def write_plan(comm, path: str | Path, plan: OverlapPlan, identity: PlanIdentity, extra: dict[str, Any]) -> dict[str, Any]:
    """Collective: write every rank's ``plan`` section into ``path`` atomically (temp file + rename).

    ``extra`` goes into the JSON header (npix, nside, buffer_pixels, figures).
    Returns the JSON header (with ``header_sha256``) on every rank. An
    existing ``path`` is replaced only once the new file is complete.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    path = Path(path)
    section = section_bytes(plan)
    digest = hashlib.sha256(section).digest()
    lengths = np.array(comm.allgather(len(section)), dtype=np.int64)
    digests = comm.gather(digest, root=0)
    relative = np.concatenate([[0], np.cumsum([_align(int(n)) for n in lengths])]).astype(np.int64)

    header_json: tuple[dict[str, Any], bytes, int] | None = None  # on root: the header, its bytes, the data offset
    temp_name = None
    problem = None
    if rank == 0:
        table = b"".join(ENTRY.pack(int(relative[r]), int(lengths[r]), digests[r]) for r in range(size))
        document = {
            "format_version": PLAN_FORMAT_VERSION,
            "scan_key": identity.scan_key,
            "ranks": identity.ranks,
            "decomposition": identity.decomposition,
            "table_sha256": hashlib.sha256(table).hexdigest(),
            **extra,
        }
        json_bytes = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        table_offset = HEADER.size
        json_offset = table_offset + len(table)
        data_offset = _align(json_offset + len(json_bytes))
        file_size = data_offset + int(relative[-1])
        fields = (MAGIC, PLAN_FORMAT_VERSION, size, table_offset, json_offset, len(json_bytes), data_offset, file_size, 0)
        header_sha = hashlib.sha256(HEADER.pack(*fields, b"\0" * 32) + json_bytes).digest()
        head = HEADER.pack(*fields, header_sha) + table + json_bytes
        document["header_sha256"] = header_sha.hex()
        header_json = (document, head, data_offset)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
            os.close(handle)
        except OSError as error:
            problem = f"cannot create the plan file beside {str(path)!r}: {error}"
    problem, temp_name = comm.bcast((problem, temp_name), root=0)
    if problem:
        raise OSError(problem)
    data_offset, file_size = comm.bcast(
        (header_json[2], header_json[2] + int(relative[-1])) if header_json is not None else None, root=0
    )

    failed = 0
    try:
        plan_file = MPI.File.Open(comm, temp_name, MPI.MODE_WRONLY)
        try:
            plan_file.Set_size(file_size)  # collective; zero padding between and after the sections
            start = data_offset + int(relative[rank])
            view = memoryview(section)
            for piece in range(0, len(section), WRITE_PIECE):
                plan_file.Write_at(start + piece, view[piece : piece + WRITE_PIECE])
            if header_json is not None:  # root
                plan_file.Write_at(0, header_json[1])
            plan_file.Sync()
        finally:
            plan_file.Close()
    except Exception:  # noqa: BLE001 - every rank must learn that the write failed
        failed = 1
    failed = comm.allreduce(failed, op=MPI.MAX)
    if rank == 0:
        if failed:
            Path(temp_name).unlink(missing_ok=True)
        else:
            fsync_path(temp_name)
            os.chmod(temp_name, 0o644)
            os.replace(temp_name, path)
            fsync_path(path.parent)
    if failed:
        raise OSError(f"writing the plan file {str(path)!r} failed on some rank")
    comm.Barrier()
    return comm.bcast(header_json[0] if header_json is not None else None, root=0)


# --------------------------------------------------------------------------- reading (per rank)


def read_header(path: str | Path) -> tuple[dict[str, Any], tuple]:
    """The verified JSON header and the fixed-header fields of a plan file; raises PlanRefused."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            fixed = handle.read(HEADER.size)
            if len(fixed) < HEADER.size:
                raise PlanRefused(f"plan {str(path)!r} is truncated (no complete header)")
            fields = HEADER.unpack(fixed)
            magic, version, _, _, json_offset, json_length, _, file_size, _, header_sha = fields
            if magic != MAGIC:
                raise PlanRefused(f"{str(path)!r} is not an overlap plan file (bad magic)")
            if version != PLAN_FORMAT_VERSION:
                raise PlanRefused(
                    f"plan {str(path)!r} has format version {version}; this mapmaker reads version {PLAN_FORMAT_VERSION}"
                )
            actual = os.fstat(handle.fileno()).st_size
            if actual != file_size:
                raise PlanRefused(f"plan {str(path)!r} is truncated or padded: {actual} bytes, its header says {file_size}")
            if json_length > 1 << 26 or json_offset + json_length > file_size:
                raise PlanRefused(f"plan {str(path)!r} has a corrupted header (JSON bounds)")
            handle.seek(json_offset)
            json_bytes = handle.read(json_length)
    except OSError as error:
        raise PlanRefused(f"cannot read plan {str(path)!r}: {error.strerror or error}") from error
    zeroed = HEADER.pack(*fields[:-1], b"\0" * 32)
    if hashlib.sha256(zeroed + json_bytes).digest() != header_sha:
        raise PlanRefused(f"plan {str(path)!r} is corrupted: header checksum mismatch")
    document = json.loads(json_bytes)
    document["header_sha256"] = header_sha.hex()
    return document, fields


def check_identity(document: dict[str, Any], identity: PlanIdentity, path: str | Path) -> None:
    """Refuse a plan built for another scan key, rank count or decomposition."""
    where = f"plan {str(path)!r}"
    if document.get("scan_key") != identity.scan_key:
        raise PlanRefused(
            f"{where} was built for scan key {str(document.get('scan_key'))[:16]}..., this run's is {identity.scan_key[:16]}... "
            "(a different scan pattern, focal plane, sampling or nside)"
        )
    if document.get("ranks") != identity.ranks:
        raise PlanRefused(f"{where} was built for {document.get('ranks')} ranks; this run has {identity.ranks}")
    if document.get("decomposition") != identity.decomposition:
        raise PlanRefused(
            f"{where} was built for another decomposition (fingerprint {str(document.get('decomposition'))[:16]}..., "
            f"this run's {identity.decomposition[:16]}...): chunks are assigned to ranks differently"
        )


def read_rank_section(path: str | Path, rank: int, identity: PlanIdentity, *, verify_table: bool = False) -> tuple[OverlapPlan, dict[str, Any]]:
    """Rank ``rank``'s verified plan and the JSON header; reads only the header, one table entry and one section.

    ``verify_table``: also read the whole index table and check its sha256
    (rank 0 does this for everyone). Raises :class:`PlanRefused`.
    """
    document, fields = read_header(path)
    check_identity(document, identity, path)
    _, _, ranks, table_offset, _, _, data_offset, file_size, _, _ = fields
    if not 0 <= rank < ranks:
        raise PlanRefused(f"rank {rank} is outside the plan's {ranks} ranks")
    try:
        with open(path, "rb") as handle:
            if verify_table:
                handle.seek(table_offset)
                table = handle.read(ENTRY.size * ranks)
                if hashlib.sha256(table).hexdigest() != document.get("table_sha256"):
                    raise PlanRefused(f"plan {str(path)!r} is corrupted: index table checksum mismatch")
            handle.seek(table_offset + ENTRY.size * rank)
            offset, length, digest = ENTRY.unpack(handle.read(ENTRY.size))
            start = data_offset + offset
            if start + length > file_size or length < SECTION_PREAMBLE.size:
                raise PlanRefused(f"plan {str(path)!r} is corrupted: rank {rank}'s section lies outside the file")
            handle.seek(start)
            data = handle.read(length)
    except OSError as error:
        raise PlanRefused(f"cannot read plan {str(path)!r}: {error.strerror or error}") from error
    if hashlib.sha256(data).digest() != digest:
        raise PlanRefused(f"plan {str(path)!r} is corrupted: checksum mismatch in rank {rank}'s section")
    plan = parse_section(data, rank, ranks, int(document["npix"]))
    return plan, document


def load_plan(comm, path: str | Path, identity: PlanIdentity) -> tuple[OverlapPlan, dict[str, Any]]:
    """Collective: each rank loads and verifies its own section; one verdict for all.

    Raises :class:`PlanRefused` on every rank if any rank refuses (the message
    of the lowest refusing rank).
    """
    rank = comm.Get_rank()
    problem, plan, document = None, None, None
    try:
        plan, document = read_rank_section(path, rank, identity, verify_table=(rank == 0))
    except PlanRefused as error:
        problem = str(error)
    problems = comm.allgather(problem)
    for message in problems:
        if message is not None:
            raise PlanRefused(message)
    assert plan is not None and document is not None  # no rank refused, so this one read its section
    return plan, document
