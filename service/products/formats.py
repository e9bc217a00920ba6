"""Encoders of the downloads: HEALPix maps as FITS or npz, binned spectra as FITS tables, npz or JSON.

Every encoder writes one file whole or not at all (:func:`schemas.files.atomic_write`).
FITS maps are written with ``healpy.write_map`` (RING, UNSEEN where there is
no value) so ``healpy.read_map`` reads them; npz files hold plain arrays with
the names listed in each function.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from schemas.files import atomic_write, atomic_write_bytes
from schemas.result import SPECTRA

if TYPE_CHECKING:
    from service.products.aggregates import BandpowerAggregates

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


def bandpower_arrays(bandpowers: BandpowerAggregates) -> dict[str, Any]:
    """The bandpowers download as named arrays (K^2; rows ``spectra`` = TT EE BB TE EB TB, ``[6, n_bins]``).

    ``ell_lo``, ``ell_hi``, ``ell`` (centres) and ``reliable`` [n_bins]; ``mean`` and ``error`` (its Monte
    Carlo error); ``model`` (input C_l with the beam through the windows) when there is one;
    ``transfer`` and ``transfer_error`` (signal-only), ``noise_bias`` and ``noise_bias_error``
    (noise-only); ``covariance`` [6 n_bins, 6 n_bins] (spectrum-major), ``n`` and ``hartlap`` (NaN
    when n <= p + 2) when there are two realisations.
    """
    arrays: dict[str, Any] = {
        "spectra": np.array(SPECTRA),
        "ell_lo": bandpowers.ell_lo,
        "ell_hi": bandpowers.ell_hi,
        "ell": bandpowers.ell_center,
        "reliable": bandpowers.reliable,
        "mean": bandpowers.mean,
        "error": bandpowers.error,
        "n": np.int64(bandpowers.n),
        "purify_b": np.bool_(bandpowers.purify_b),
        "mask_sha256": np.str_(bandpowers.mask_sha256),
    }
    if bandpowers.model is not None:
        arrays["model"] = bandpowers.model
    if bandpowers.transfer_available:
        arrays["transfer"], arrays["transfer_error"] = bandpowers.transfer_function()
    if bandpowers.noise_bias_available:
        arrays["noise_bias"], arrays["noise_bias_error"] = bandpowers.noise_bias()
    if bandpowers.covariance is not None:
        arrays["covariance"] = bandpowers.covariance
        arrays["hartlap"] = np.float64(np.nan if bandpowers.hartlap is None else bandpowers.hartlap)
    return arrays


def write_bandpowers_npz(path: Path, arrays: dict[str, Any], scalars: dict[str, Any]) -> None:
    merged: dict[str, Any] = {**arrays, **{name: np.asarray(value) for name, value in scalars.items()}}
    atomic_write(path, lambda handle: np.savez(handle, **merged))


def write_bandpowers_fits(path: Path, arrays: dict[str, Any], scalars: dict[str, Any]) -> None:
    """FITS: table ``BANDPOWERS`` (one row per bin: ``ELL_LO``, ``ELL_HI``, ``ELL``, then ``<ARRAY>_<SPECTRUM>``
    for mean, error, model, transfer, noise_bias and their errors) and image ``COVARIANCE`` [p, p] (header
    ``N``, ``HARTLAP``); scalars in the table's header."""
    from astropy.io import fits  # deferred: about 1.3 s to import, paid by the first FITS table download

    columns = [
        fits.Column(name="ELL_LO", format="K", array=arrays["ell_lo"]),
        fits.Column(name="ELL_HI", format="K", array=arrays["ell_hi"]),
        fits.Column(name="ELL", format="D", array=arrays["ell"]),
        fits.Column(name="RELIABLE", format="L", array=arrays["reliable"]),
    ]
    for key in ("mean", "error", "model", "transfer", "transfer_error", "noise_bias", "noise_bias_error"):
        if key in arrays:
            for row, name in enumerate(SPECTRA):
                columns.append(fits.Column(name=f"{key.upper()}_{name}", format="D", array=arrays[key][row]))
    table = fits.BinTableHDU.from_columns(columns, name="BANDPOWERS")
    table.header["N"] = int(arrays["n"])
    table.header["PURIFYB"] = bool(arrays["purify_b"])
    table.header["MASKSHA"] = str(arrays["mask_sha256"])[:64]
    for key, value in scalars.items():
        if value is not None:
            table.header[key.upper()[:8]] = value
    hdus = [fits.PrimaryHDU(), table]
    if "covariance" in arrays:
        covariance = fits.ImageHDU(arrays["covariance"], name="COVARIANCE")
        covariance.header["N"] = int(arrays["n"])
        hartlap = float(arrays["hartlap"])
        covariance.header["HARTLAP"] = hartlap if np.isfinite(hartlap) else "undefined"
        covariance.header["BUNIT"] = "K^4"
        hdus.append(covariance)
    listed = fits.HDUList(hdus)
    atomic_write(path, lambda handle: listed.writeto(handle))
