"""The two-level preconditioner's coarse operator in a file, shared by the realisations of a campaign.

``realize --coarse-cache FILE``: the coarse operator (:class:`~mapmaker.solve.coarse.CoarseOperator`:
``E = Z^T A Z`` and every rank's held rows of ``A Z``) depends on the pointing, the cut, the noise
model and the rank count, never on the data (:func:`schemas.spec.coarse_key` names what it depends on).
The first realisation that finds no file builds it (about 0.6 of a PCG iteration per coarse column)
and writes it; the others read it in a fraction of a second.

The file is an uncompressed ``.npz`` (numpy's zip of ``.npy`` members), written atomically by rank 0
(:func:`schemas.files.atomic_write`: a reader sees the whole file or none):

``header``        JSON: format, the coarse key, rank count, coarse nside, column count, ``matrix_sha256``
``matrix``        E [K, K] float64
``pixels_<r>``    rank r's held pixels [n_held] int64 (global RING ids): the rows it holds
``columns_<r>``   rank r's ``A Z`` rows [K, 3 n_held] float32 ([K, 0] for the additive form, which needs E only)

Every rank reads the header, ``matrix`` and its own two members. A file is refused
(:class:`CoarseRefused`), on every rank alike, when it is not readable (zip's CRC-32 of each member is
checked on reading: a damaged byte is a refusal), when its format, key, rank count, nside or column count
differ from this run's, when a rank's held pixels are not the ones it holds here, or when ``matrix`` does
not match its sha256. A refused file is never used: the run builds the operator as if there were no file
and replaces it (the operator is a cache of the inputs, so rebuilding is always right).

Beside the file, ``<file>.timings/`` holds what ``auto`` compares once the operator is cached
(:func:`mapmaker.solve.coarse.choose_by_timing`): one small JSON file per timed realisation,
``{"key", "tol", "preconditioner", "seconds", "iterations"}``, each written atomically under a name of
its own, so realisations running at once never overwrite each other's. Records of another key or
tolerance, and files that are not such a record (or are links, or larger than a record can be), are
ignored. Removing the folder starts the trials again (after a change of machine, say).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from mapmaker.solve.coarse import TIMED_PRECONDITIONERS, CoarseOperator, SolveTiming
from schemas.files import atomic_write, atomic_write_json

COARSE_FORMAT = 2  # bump with schemas.spec.COARSE_KEY_VERSION; 2: rows spread over the observers, not the owners
# What reading a file that is not (or no longer) a coarse file raises: a bad zip or a bad CRC-32, a missing
# member, a short read, a header that is not JSON or an array that is not what the header says.
UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error)


TIMING_RECORD_MAX_BYTES = 1024
TIMINGS_READ_MAX = 256  # records read per choice: the trials need two; a folder grown past this is not read further


class CoarseRefused(ValueError):
    """A coarse file that cannot be used here (the message says why); raised on every rank alike."""


def matrix_checksum(matrix: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(matrix, dtype=np.float64).tobytes()).hexdigest()


def _identity(key: str, ranks: int, coarse_nside: int, n_columns: int) -> dict[str, int | str]:
    """What a file's header must say for this run to use it (and what a written file's says)."""
    return {"format": COARSE_FORMAT, "key": key, "ranks": ranks, "coarse_nside": int(coarse_nside),
            "n_columns": int(n_columns)}


def read_coarse_operator(
    comm: MPI.Comm, path: str | Path, *, key: str, coarse_nside: int, n_columns: int, held_pixels: np.ndarray,
    rows: int,
) -> CoarseOperator | None:
    """Collective: this rank's coarse operator from ``path``; None when there is no file (rank 0 looks).

    ``rows``: the rows of ``A Z`` this rank holds (3 n_held for A-DEF2, 0 for the additive form).

    Raises :class:`CoarseRefused` on every rank when any rank cannot use the file (module doc).
    """
    path = Path(path)
    exists = comm.bcast(path.exists() if comm.Get_rank() == 0 else None, root=0)
    if not exists:
        return None
    operator, problem = None, None
    try:
        operator = _read_rank(comm, path, key=key, coarse_nside=coarse_nside, n_columns=n_columns,
                              held_pixels=held_pixels, rows=rows)
    except UNREADABLE as error:  # an unreadable or foreign file is a refusal, never a crash of the run
        problem = f"rank {comm.Get_rank()}: {type(error).__name__}: {error}"
    problems = [p for p in comm.allgather(problem) if p is not None]
    if problems:
        raise CoarseRefused(f"--coarse-cache {str(path)!r} refused ({problems[0]})")
    return operator


def _read_rank(
    comm: MPI.Comm, path: Path, *, key: str, coarse_nside: int, n_columns: int, held_pixels: np.ndarray, rows: int
) -> CoarseOperator:
    rank = comm.Get_rank()
    with np.load(path, allow_pickle=False) as members:
        header = json.loads(str(members["header"]))
        for name, value in _identity(key, comm.Get_size(), coarse_nside, n_columns).items():
            if header.get(name) != value:
                raise ValueError(f"{name} is {header.get(name)!r} in the file, {value!r} in this run")
        pixels = members[f"pixels_{rank}"]
        if not np.array_equal(pixels, held_pixels):
            raise ValueError("the held pixels in the file are not the ones this rank holds")
        matrix = members["matrix"]
        if matrix.shape != (n_columns, n_columns) or matrix.dtype != np.float64:
            raise ValueError(f"matrix of shape {matrix.shape} {matrix.dtype}, expected ({n_columns}, {n_columns}) float64")
        if matrix_checksum(matrix) != header.get("matrix_sha256"):
            raise ValueError("matrix does not match its sha256")
        columns = members[f"columns_{rank}"]
        shape = (n_columns, rows)
        if columns.shape != shape or columns.dtype != np.float32:
            raise ValueError(f"columns of shape {columns.shape} {columns.dtype}, expected {shape} float32")
    return CoarseOperator(matrix=matrix, columns=columns)


def write_coarse_operator(
    comm: MPI.Comm, path: str | Path, operator: CoarseOperator, *, key: str, coarse_nside: int,
    held_pixels: np.ndarray,
) -> str | None:
    """Collective: rank 0 gathers every rank's rows and writes ``path`` atomically.

    Returns None when written, else why not (on every rank): a file that cannot be written costs the next
    realisation a build, never this one its map.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    counts = comm.gather((len(held_pixels), operator.columns.shape[1]), root=0)
    members: dict[str, Any] = {}  # arrays by member name; Any so that np.savez(**members) type-checks
    if rank == 0:
        assert counts is not None
        members["matrix"] = operator.matrix
        members["pixels_0"], members["columns_0"] = held_pixels, operator.columns
        for r in range(1, size):
            pixels = np.empty(counts[r][0], dtype=np.int64)
            columns = np.empty((operator.n_columns, counts[r][1]), dtype=np.float32)
            comm.Recv(pixels, source=r, tag=71)
            comm.Recv(columns, source=r, tag=72)
            members[f"pixels_{r}"], members[f"columns_{r}"] = pixels, columns
    else:
        comm.Send(np.ascontiguousarray(held_pixels, dtype=np.int64), dest=0, tag=71)
        comm.Send(np.ascontiguousarray(operator.columns, dtype=np.float32), dest=0, tag=72)
    problem = None
    if rank == 0:
        header = {**_identity(key, size, coarse_nside, operator.n_columns), "matrix_sha256": matrix_checksum(operator.matrix)}
        members["header"] = np.array(json.dumps(header))
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda handle: np.savez(handle, **members))
        except OSError as error:
            problem = f"could not write {str(path)!r}: {error}"
    return comm.bcast(problem, root=0)


def timings_folder(path: str | Path) -> Path:
    """The folder of ``auto``'s solve timings beside the coarse file ``path`` (module doc)."""
    path = Path(path)
    return path.with_name(path.name + ".timings")


def read_solve_timings(path: str | Path, *, key: str, tol: float) -> list[SolveTiming]:
    """The solve timings recorded beside the coarse file ``path`` for ``key`` and ``tol`` (rank 0 only: plain I/O)."""
    folder = timings_folder(path)
    if not folder.is_dir():
        return []
    timings = []
    for record_path in sorted(folder.glob("*.json"))[:TIMINGS_READ_MAX]:
        try:
            # O_NOFOLLOW: a link is refused by the open itself (ELOOP), with no window to swap one in after a check
            with os.fdopen(os.open(record_path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
                data = handle.read(TIMING_RECORD_MAX_BYTES + 1)
            if len(data) > TIMING_RECORD_MAX_BYTES:
                continue
            record = json.loads(data)
            timing = SolveTiming(preconditioner=str(record["preconditioner"]), seconds=float(record["seconds"]),
                                 iterations=int(record["iterations"]))
            if record["key"] != key or record["tol"] != tol:
                continue
        except (OSError, ValueError, KeyError, TypeError):  # not a record: ignored, as a foreign file is
            continue
        if timing.preconditioner in TIMED_PRECONDITIONERS and math.isfinite(timing.seconds) and timing.seconds > 0:
            timings.append(timing)
    return timings


def record_solve_timing(path: str | Path, timing: SolveTiming, *, key: str, tol: float) -> str | None:
    """Add ``timing`` to the records beside the coarse file ``path`` (rank 0 only); None when written, else why
    not: a record that cannot be written costs a later realisation one more trial, never this one its map."""
    record = {"key": key, "tol": tol, "preconditioner": timing.preconditioner, "seconds": timing.seconds,
              "iterations": timing.iterations}
    try:
        atomic_write_json(timings_folder(path) / f"{timing.preconditioner}-{uuid.uuid4().hex}.json", record)
    except OSError as error:
        return f"could not record the solve's time beside {str(path)!r}: {error}"
    return None
