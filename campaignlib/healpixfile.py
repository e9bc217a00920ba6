"""Reading a HEALPix FITS map, full-sky or cut-sky, as the service (aggregates) and the worker (site sums) both do.

healpy and astropy are imported when a map is read, not with the module.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np


class NotAHealpixMap(ValueError):
    """A file that is not a readable HEALPix map with the fields asked for."""


def read_healpix_fields(path: Path, n_fields: int) -> tuple[int, np.ndarray | None, np.ndarray]:
    """The first ``n_fields`` fields of a HEALPix FITS map, full-sky or cut-sky, without filling the sky.

    Returns ``(npix, pixels, values)``: for a cut-sky file (explicit indexing) ``pixels`` [n] RING
    indices (checked: integers in [0, npix), each once) and ``values`` [n_fields, n] float64; for a
    full-sky file ``pixels`` None and ``values`` [n_fields, npix] (UNSEEN where there is no value).
    Raises :class:`NotAHealpixMap` for anything else, before reading more than the header for a
    cut-sky file whose sizes disagree.
    """
    import healpy as hp  # deferred: healpy takes 1-3 s to import here, paid only when a map is read or written
    from astropy.io import fits

    try:
        with fits.open(path, memmap=False) as hdus:
            if len(hdus) < 2 or not isinstance(hdus[1], fits.BinTableHDU):
                raise NotAHealpixMap(f"{path.name}: no HEALPix table")
            header = hdus[1].header
            explicit = str(header.get("INDXSCHM", "")).strip().upper() == "EXPLICIT"
            if explicit or str(header.get("OBJECT", "")).strip().upper() == "PARTIAL":
                nside = header.get("NSIDE")
                if not isinstance(nside, int) or not hp.isnsideok(nside):
                    raise NotAHealpixMap(f"{path.name}: cut-sky file without a valid NSIDE")
                if str(header.get("ORDERING", "RING")).strip().upper() != "RING":
                    raise NotAHealpixMap(f"{path.name}: cut-sky file not in RING order")
                npix = hp.nside2npix(nside)
                names = hdus[1].columns.names
                if len(names) < n_fields + 1 or names[0].upper() != "PIXEL" or hdus[1].header["NAXIS2"] > npix:
                    raise NotAHealpixMap(f"{path.name}: cut-sky file without PIXEL and {n_fields} fields")
                pixels = np.asarray(hdus[1].data.field(0))
                if pixels.dtype.kind not in "iu" or pixels.ndim != 1:
                    raise NotAHealpixMap(f"{path.name}: PIXEL is not a column of integers")
                pixels = pixels.astype(np.int64)
                if pixels.size and (pixels.min() < 0 or pixels.max() >= npix):
                    raise NotAHealpixMap(f"{path.name}: PIXEL outside 0..{npix - 1}")
                # A flag per sky pixel, not np.unique: 5 ms against 4 s for the 2.75 M pixels of a nside-512
                # map (np.unique hashes, then sorts), for npix bytes (50 MB at nside 2048).
                listed = np.zeros(npix, dtype=np.bool_)
                listed[pixels] = True
                if np.count_nonzero(listed) != pixels.size:
                    raise NotAHealpixMap(f"{path.name}: a pixel listed twice")
                del listed
                values = np.empty((n_fields, pixels.size))
                for field in range(n_fields):
                    column = np.asarray(hdus[1].data.field(field + 1))
                    if column.shape != pixels.shape:
                        raise NotAHealpixMap(f"{path.name}: field {field} is not one value per pixel")
                    values[field] = column
                return npix, pixels, values
    except NotAHealpixMap:
        raise
    except Exception as error:  # noqa: BLE001 - astropy raises many kinds for a bad file
        raise NotAHealpixMap(f"{path.name} is not a HEALPix map ({type(error).__name__})") from None
    try:
        with warnings.catch_warnings():  # a broken file is reported once by the caller
            warnings.simplefilter("ignore")
            maps = np.asarray(hp.read_map(str(path), field=tuple(range(n_fields)), dtype=np.float64))
    except Exception as error:  # noqa: BLE001 - healpy/astropy raise many kinds for a bad file
        raise NotAHealpixMap(f"{path.name} is not a HEALPix map ({type(error).__name__})") from None
    maps = np.atleast_2d(maps)
    if maps.ndim != 2 or maps.shape[0] != n_fields or not hp.isnpixok(maps.shape[1]):
        raise NotAHealpixMap(f"{path.name} is not a HEALPix map of {n_fields} fields")
    return maps.shape[1], None, maps


def observed_columns(pixels: np.ndarray | None, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where a map read by :func:`read_healpix_fields` has a value in every field (finite, not UNSEEN).

    Returns ``(where, columns)``: ``where`` [n] the RING pixels, ``columns`` [n] their columns of
    ``values`` (the same as ``where`` for a full-sky map), so that ``values[:, columns]`` are theirs.
    """
    seen = np.all(np.isfinite(values), axis=0) & np.all(np.abs(values) < 1e29, axis=0)  # UNSEEN is -1.6375e30
    columns = np.flatnonzero(seen)
    return (columns if pixels is None else pixels[columns]), columns
