"""Encoders of the downloads: HEALPix maps as FITS or npz, binned spectra as FITS tables, npz or JSON.

Every encoder writes one file whole or not at all (:func:`schemas.files.atomic_write`).
FITS maps are written with ``healpy.write_map`` (RING, UNSEEN where there is
no value) so ``healpy.read_map`` reads them; npz files hold plain arrays with
the names listed in each function.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from schemas.files import atomic_write, atomic_write_bytes
from schemas.result import SPECTRA

MEDIA_TYPES = {"fits": "application/fits", "npz": "application/octet-stream", "json": "application/json"}


def write_map_fits(path: Path, maps: np.ndarray, names: list[str], unit: str, header: list[tuple[str, Any]]) -> None:
    """``maps [k, npix]`` (RING) as a HEALPix FITS file with one column per name."""
    import healpy as hp  # deferred: healpy takes 1-3 s to import here, paid only when a map is read or written

    # healpy writes to a path, not a handle: write beside the target, then rename atomically.
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".write-") as folder:
        scratch = Path(folder) / "map.fits"
        hp.write_map(
            str(scratch),
            np.asarray(maps, dtype=np.float64),
            dtype=np.float64,
            column_names=names,
            column_units=unit,
            extra_header=header,
        )
        payload = scratch.read_bytes()
    atomic_write_bytes(path, payload)


def write_map_npz(path: Path, **arrays: Any) -> None:
    atomic_write(path, lambda handle: np.savez(handle, allow_pickle=True, **arrays))


def spectra_columns(data: dict[str, Any]) -> dict[str, np.ndarray]:
    """Flat named columns [n_bins] of a spectra download (see :func:`service.products.service.spectra_table`)."""
    return {
        name: np.asarray(values, dtype=np.float64 if not name.startswith("ell_m") else np.int64)
        for name, values in data.items()
    }


def write_spectra_npz(path: Path, columns: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
    arrays = dict(columns)
    arrays.update({name: np.asarray(value) for name, value in scalars.items()})
    arrays["spectra"] = np.array(SPECTRA)
    atomic_write(path, lambda handle: np.savez(handle, allow_pickle=True, **arrays))


def write_spectra_fits(path: Path, columns: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
    """A FITS binary table (extension ``SPECTRA``), one row per bin; scalars in the header."""
    from astropy.io import fits  # deferred: about 1.3 s to import, paid by the first FITS table download

    table = fits.BinTableHDU.from_columns(
        [
            fits.Column(name=name.upper(), format="K" if values.dtype.kind == "i" else "D", array=values)
            for name, values in columns.items()
        ],
        name="SPECTRA",
    )
    for key, value in scalars.items():
        if value is None:
            continue
        table.header[key.upper()[:8]] = value
    hdus = fits.HDUList([fits.PrimaryHDU(), table])

    def write(handle: Any) -> None:
        hdus.writeto(handle)

    atomic_write(path, write)
