"""A site's partial map sums for one campaign: the file the worker keeps and sends, and the service checks and merges.

When a site keeps its maps (site setting ``products.maps = "keep"``), the campaign's mean and
variance maps are built from per-site sums instead of the maps themselves: each site adds the maps of
its accepted realisations to a running count, mean and M2 per observed pixel (Welford), and the service
merges the sites' sums with its own (Chan, Golub and LeVeque: :func:`campaignlib.montecarlo.moments_merge`).
The service's work and traffic then grow with the number of sites, not of realisations.

The file is an ``.npz`` (no pickles) with these members, all little-endian:

=========  ===============  ==============================================================================
``format``  int64 scalar     :data:`SITE_SUMS_FORMAT`
``nside``   int64 scalar     HEALPix resolution of the campaign's maps (ring ordering)
``pixels``  int64 ``[n]``    observed pixels, strictly increasing, in ``[0, 12 nside^2)``
``count``   int64 ``[n]``    realisations that observed each pixel (>= 1)
``mean``    float64 ``[3, n]``  mean I, Q, U (K)
``m2``      float64 ``[3, n]``  sum of squared deviations from the mean (K^2, >= 0)
``ledger``  int64 ``[k, 2]`` realisation indexes included, as sorted disjoint ``[start, stop)`` ranges
=========  ===============  ==============================================================================

Its version is the number of realisations in the ledger: sums only grow, so a send with fewer
realisations than the service holds for the site is an older one and is refused.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from campaignlib.montecarlo import moments_merge
from schemas.files import atomic_write

SITE_SUMS_FORMAT = 1
MEMBERS = ("format", "nside", "pixels", "count", "mean", "m2", "ledger")
MAX_NSIDE = 1 << 13
MAX_LEDGER_RANGES = 1 << 20


class SiteSumsInvalid(ValueError):
    """A sums file that cannot be used; ``field`` names the member at fault."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# --------------------------------------------------------------------------- ledger: sorted [start, stop) ranges


def ledger_add(ranges: list[list[int]], index: int) -> list[list[int]]:
    """The ranges with ``index`` added, merged with their neighbours."""
    merged: list[list[int]] = []
    for start, stop in sorted([*ranges, [index, index + 1]]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return merged


def ledger_contains(ranges: list[list[int]], index: int) -> bool:
    return any(start <= index < stop for start, stop in ranges)


def ledger_count(ranges: list[list[int]]) -> int:
    return sum(stop - start for start, stop in ranges)


def ledgers_overlap(a: list[list[int]], b: list[list[int]]) -> list[int]:
    """Up to 10 indexes in both ledgers (sorted ranges), for an error message."""
    found: list[int] = []
    i = j = 0
    while i < len(a) and j < len(b) and len(found) < 10:
        start, stop = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        found.extend(range(start, min(stop, start + 10 - len(found))))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return found


# --------------------------------------------------------------------------- the sums


@dataclass(frozen=True)
class SiteSums:
    """Per-pixel moments of a site's maps over its observed pixels (shapes in the module doc)."""

    nside: int
    pixels: np.ndarray
    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    ledger: list[list[int]]

    @property
    def version(self) -> int:
        return ledger_count(self.ledger)

    @classmethod
    def empty(cls, nside: int) -> SiteSums:
        return cls(nside, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((3, 0)), np.zeros((3, 0)), [])

    def includes(self, index: int) -> bool:
        return ledger_contains(self.ledger, index)


def add_map(sums: SiteSums, index: int, pixels: np.ndarray, iqu: np.ndarray) -> SiteSums:
    """``sums`` with realisation ``index``'s map added: ``pixels [m]`` int64 its observed pixels (any order,
    unique), ``iqu [3, m]`` K its values there. A realisation already in the ledger is not added again."""
    if sums.includes(index):
        return sums
    one = SiteSums(
        sums.nside, np.asarray(pixels, np.int64), np.ones(len(pixels), np.int64),
        np.asarray(iqu, np.float64), np.zeros((3, len(pixels))), [[index, index + 1]],
    )  # fmt: skip
    order = np.argsort(one.pixels, kind="stable")
    one = SiteSums(one.nside, one.pixels[order], one.count, one.mean[:, order], one.m2, one.ledger)
    return merge(sums, one)


def merge(a: SiteSums, b: SiteSums) -> SiteSums:
    """The sums of both sets of realisations (their ledgers must be disjoint), over the union of their pixels."""
    if a.nside != b.nside:
        raise SiteSumsInvalid("nside", f"{b.nside} differs from {a.nside}")
    pixels = np.union1d(a.pixels, b.pixels)
    count = np.zeros(pixels.size, np.int64)
    mean = np.zeros((3, pixels.size))
    m2 = np.zeros((3, pixels.size))
    at_a = np.searchsorted(pixels, a.pixels)
    count[at_a], mean[:, at_a], m2[:, at_a] = a.count, a.mean, a.m2
    at_b = np.searchsorted(pixels, b.pixels)
    count[at_b], mean[:, at_b], m2[:, at_b] = moments_merge(
        count[at_b], mean[:, at_b], m2[:, at_b], b.count, b.mean, b.m2
    )
    ledger = a.ledger
    for start, stop in b.ledger:
        for index in range(start, stop):
            ledger = ledger_add(ledger, index)
    return SiteSums(a.nside, pixels, count, mean, m2, ledger)


# --------------------------------------------------------------------------- the file


def write(path: Path, sums: SiteSums) -> None:
    """Write ``sums`` atomically (temporary file, fsync, rename)."""
    members: dict[str, Any] = {  # by member name; Any so that np.savez(**members) type-checks
        "format": np.asarray(SITE_SUMS_FORMAT, dtype="<i8"),
        "nside": np.asarray(sums.nside, dtype="<i8"),
        "pixels": sums.pixels.astype("<i8"),
        "count": sums.count.astype("<i8"),
        "mean": sums.mean.astype("<f8"),
        "m2": sums.m2.astype("<f8"),
        "ledger": np.asarray(sums.ledger, dtype="<i8").reshape(-1, 2),
    }
    atomic_write(path, lambda handle: np.savez(handle, **members))


def _header(archive: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of member ``name`` read from its .npy header alone (nothing of the array read)."""
    try:
        with archive.open(name + ".npy") as stream:
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    except KeyError:
        raise SiteSumsInvalid(name, "missing") from None
    except (ValueError, OSError, zipfile.BadZipFile) as error:
        raise SiteSumsInvalid(name, f"not a numpy array ({error})") from None
    if fortran or dtype.hasobject:
        raise SiteSumsInvalid(name, "must be a C-ordered array of numbers")
    return shape, dtype


def read(path: Path, *, nside: int | None = None) -> SiteSums:
    """Read and check a sums file (hostile input: every shape, dtype and value is checked before use).

    ``nside``: the campaign's, which the file must carry. Raises :class:`SiteSumsInvalid` naming the member.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise SiteSumsInvalid("(file)", f"not an npz archive ({error})") from None
    with archive:
        names = {name.removesuffix(".npy") for name in archive.namelist()}
        if names != set(MEMBERS):
            raise SiteSumsInvalid("(file)", f"members must be {', '.join(MEMBERS)}; found {', '.join(sorted(names))}")
        shapes = {name: _header(archive, name) for name in MEMBERS}
        for name in ("format", "nside"):
            if shapes[name][0] != () or shapes[name][1].kind not in "iu":
                raise SiteSumsInvalid(name, "must be an integer scalar")
        with np.load(path, allow_pickle=False) as data:
            if int(data["format"]) != SITE_SUMS_FORMAT:
                raise SiteSumsInvalid("format", f"{int(data['format'])} is not {SITE_SUMS_FORMAT}")
            file_nside = int(data["nside"])
            if not 1 <= file_nside <= MAX_NSIDE or file_nside & (file_nside - 1):
                raise SiteSumsInvalid("nside", f"{file_nside} is not a power of 2 up to {MAX_NSIDE}")
            if nside is not None and file_nside != nside:
                raise SiteSumsInvalid("nside", f"{file_nside} differs from the campaign's {nside}")
            (n,) = _check(shapes, "pixels", "iu", 1)
            _check(shapes, "count", "iu", 1, (n,))
            _check(shapes, "mean", "f", 2, (3, n))
            _check(shapes, "m2", "f", 2, (3, n))
            shape = _check(shapes, "ledger", "iu", 2)
            if shape[1:] != (2,) or shape[0] > MAX_LEDGER_RANGES:
                raise SiteSumsInvalid("ledger", f"shape {shape} is not [k, 2] with k <= {MAX_LEDGER_RANGES}")
            pixels = data["pixels"].astype(np.int64)
            if n and (pixels[0] < 0 or pixels[-1] >= 12 * file_nside**2 or np.any(np.diff(pixels) <= 0)):
                raise SiteSumsInvalid(
                    "pixels", f"must be strictly increasing pixel indexes in [0, {12 * file_nside**2})"
                )
            count = data["count"].astype(np.int64)
            if np.any(count < 1):
                raise SiteSumsInvalid("count", "must be at least 1 at every listed pixel")
            mean = data["mean"].astype(np.float64)
            if not np.all(np.isfinite(mean)):
                raise SiteSumsInvalid("mean", "must be finite")
            m2 = data["m2"].astype(np.float64)
            if not np.all(np.isfinite(m2)) or np.any(m2 < 0):
                raise SiteSumsInvalid("m2", "must be finite and >= 0")
            ledger_array = data["ledger"].astype(np.int64)
        ledger = [[int(a), int(b)] for a, b in ledger_array]
        if any(start < 0 or stop <= start for start, stop in ledger) or any(
            ledger[i][1] >= ledger[i + 1][0] for i in range(len(ledger) - 1)
        ):
            raise SiteSumsInvalid(
                "ledger", "must be sorted, disjoint, non-adjacent [start, stop) ranges of indexes >= 0"
            )
        if n and int(count.max()) > ledger_count(ledger):
            raise SiteSumsInvalid("count", f"exceeds the {ledger_count(ledger)} realisations of the ledger")
    return SiteSums(file_nside, pixels, count, mean, m2, ledger)


def _check(
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]],
    name: str,
    kinds: str,
    ndim: int,
    shape: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    found, dtype = shapes[name]
    if dtype.kind not in kinds or len(found) != ndim or (shape is not None and found != shape):
        want = f"shape {list(shape)}" if shape is not None else f"{ndim} dimensions"
        raise SiteSumsInvalid(name, f"{dtype} of shape {list(found)}; expected {kinds!r} numbers of {want}")
    return found
