"""The decoupled bandpowers of one map on a campaign's mask: ``python -m mapmaker bandpowers``.

The service asks for these when a user wants the spectrum of a data map (it may not import the
map-maker; it starts this program, as the worker starts ``realize``). The map is treated exactly
as a realisation's: the I map's monopole and dipole over the mask removed, then
:func:`mapmaker.model.bandpowers.decoupled_bandpowers` with the coupling of the mask the campaigns
were made with (read from the coupling file when one is named and exists, else built, and written to
the named file for the next map: the service keeps one per coupling key and mask).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import healpy as hp
import numpy as np
from astropy.io import fits
from threadpoolctl import threadpool_limits

from mapmaker.model import bandpowers
from schemas.files import atomic_write
from schemas.result import SPECTRA, MapBandpowers


class MapUnusable(ValueError):
    """The map cannot give bandpowers on this mask (not HEALPix I/Q/U, another nside, holes inside the mask)."""


def _read(path: Path, fields: int | tuple[int, ...], what: str) -> np.ndarray:
    try:
        with warnings.catch_warnings():  # healpy warns about headers; a bad file is reported once, below
            warnings.simplefilter("ignore")
            return np.asarray(hp.read_map(str(path), field=fields, dtype=np.float64))
    except Exception as error:  # noqa: BLE001 - healpy/astropy raise many kinds for a file that is not a map
        raise MapUnusable(
            f"the {what} is not a HEALPix FITS map with {fields} field(s) ({type(error).__name__})"
        ) from None


def _map_fields(path: Path) -> int | None:
    """The number of columns of a HEALPix FITS map's first table (``TFIELDS``), or None when the header does not
    say (then the read itself reports the problem). Only the header is read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fields = fits.getheader(str(path), 1).get("TFIELDS")
    except Exception:  # noqa: BLE001 - not a FITS table: the read below names the problem
        return None
    return fields if isinstance(fields, int) else None


def map_bandpowers(
    *,
    map_path: Path,
    mask_path: Path,
    mask_sha256: str,
    bin_width: int,
    lmax: int,
    purify_b: bool,
    coupling_path: Path | None = None,
) -> MapBandpowers:
    """Decoupled bandpowers of the I/Q/U map in ``map_path`` (K) on the mask in ``mask_path``.

    With ``coupling_path`` the coupling is read from that file when it exists, else built and written there.
    Raises :class:`MapUnusable` for a map that cannot be used and
    :class:`mapmaker.model.bandpowers.CouplingMismatch` when the mask (or the coupling file) is not
    the one ``mask_sha256`` names, or the coupling file was built for another binning.
    """
    mask = _read(mask_path, 0, "mask")
    if bandpowers.mask_checksum(mask) != mask_sha256:
        raise bandpowers.CouplingMismatch(
            f"the mask file's sha256 is {bandpowers.mask_checksum(mask)}, the campaigns' mask is {mask_sha256}"
        )
    fields = _map_fields(map_path)
    if fields is not None and fields < 3:
        raise MapUnusable(
            f"the map has {fields} field{'s' if fields > 1 else ''} (I only?): the bandpowers need I, Q and U; "
            "for TT alone, write Q and U as zeros"
        )
    iqu = _read(map_path, (0, 1, 2), "map")
    if iqu.shape != (3, mask.size):
        raise MapUnusable(
            f"the map has nside {hp.npix2nside(iqu.shape[-1])}, the campaigns' mask nside {hp.npix2nside(mask.size)}"
        )
    inside = mask > 0
    holes = ~np.all(np.isfinite(iqu[:, inside]) & (iqu[:, inside] != hp.UNSEEN), axis=0)
    if holes.any():
        raise MapUnusable(f"{int(holes.sum())} pixels inside the mask have no value (UNSEEN, NaN or infinite)")
    nside = hp.npix2nside(mask.size)
    try:
        binning = bandpowers.Binning(nside=nside, bin_width=bin_width, lmax=lmax)
    except ValueError as error:
        raise MapUnusable(str(error)) from None
    # One OpenMP thread: pspy's threads spin-wait, and this runs beside the service (module doc of bandpowers).
    with threadpool_limits(limits=1, user_api="openmp"):
        build_s = None
        if coupling_path is not None and coupling_path.exists():
            coupling = bandpowers.Coupling.read_npz(
                str(coupling_path), mask_sha256=mask_sha256, binning=binning, purify_b=purify_b
            )
        else:
            started = time.perf_counter()
            coupling = bandpowers.build_coupling(mask, binning, purify_b=purify_b)
            build_s = time.perf_counter() - started
            if coupling_path is not None:  # kept for the next map on this mask (written whole, or not at all)
                atomic_write(coupling_path, coupling.write_npz)
        cleaned = iqu.copy()
        cleaned[0], monopole, dipole = bandpowers.remove_monopole_dipole(iqu[0], mask)
        started = time.perf_counter()
        measured = bandpowers.decoupled_bandpowers(cleaned, coupling)
        bandpowers_s = time.perf_counter() - started
    return MapBandpowers(
        ell_lo=[int(v) for v in measured.ell_lo],
        ell_hi=[int(v) for v in measured.ell_hi],
        lmax=binning.lmax,
        bin_width=binning.bin_width,
        purify_b=purify_b,
        mask_sha256=mask_sha256,
        nside=nside,
        cb={name: [float(v) for v in measured.cb[row]] for row, name in enumerate(SPECTRA)},
        monopole_k=monopole,
        dipole_k=[float(v) for v in dipole],
        coupling_source="built" if build_s is not None else "file",
        coupling_build_s=build_s,
        bandpowers_s=bandpowers_s,
    )
