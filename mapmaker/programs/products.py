"""Products of one realisation, written by root into a folder that appears whole or not at all.

Everything is written into a hidden temporary sibling of ``--out``
(``.NAME.partial-XXXX``) and the folder is renamed to ``--out`` at the very
end, so a killed run never leaves a folder that looks complete.

Files (HEALPix RING, readable with ``healpy.read_map``, which gives the full map back):

* ``map_iqu.fits`` -- I, Q, U (K) in cut-sky form (explicit indexing: a ``PIXEL``
  column, int32, and one column per field) over the observed pixels (hits > 0);
  UNSEEN where cut by rcond, and (``read_map``) everywhere unobserved. float64,
  or float32 with ``products.map_precision = "float32"`` (about 7 significant
  digits: ample for a map whose noise is far above 1e-7 of its values; every
  aggregate of the service still accumulates in float64);
* ``hits.fits``    -- samples per pixel (int32), cut-sky over the same pixels
  (``read_map`` gives UNSEEN, not 0, where unobserved);
* ``rcond.fits``   -- reciprocal condition number of the geometric 3x3
  hit matrix (float32: a value in [0, 1/3] compared with a threshold of a few
  digits), cut-sky over the same pixels;
* ``mask.fits``    -- the apodised analysis mask of the spectra (``mapmaker.model.spectra``),
  full sky float64 (its sha256 over the full map names the coupling). It depends on the
  pointing only and goes with the coupling: written by a realisation that built the
  coupling into the site's coupling file, and by realisation 0 (so that every campaign's
  service has it), not by the others;
* ``spectra.npz``  -- rows TT, EE, BB, TE, EB, TB (``spectra``) everywhere, K^2:

  - pseudo-spectra: ``cl`` [6, lmax + 1] and ``cl_binned`` [6, n_bins],
    ``ell_min``/``ell_max`` of the bins, ``w2``, ``fsky``, and
    ``model``/``model_binned`` (C_l^in B_l^2) when a CMB sky was simulated;
  - decoupled bandpowers (``mapmaker.model.bandpowers``): ``bandpowers``
    [6, n_bandpowers], ``bandpower_ell`` [n_bandpowers] (bin centres),
    ``bandpower_ell_lo``/``bandpower_ell_hi``, ``bandpower_purify_b``,
    ``bandpower_reliable`` [n_bandpowers] bool, and ``model_bandpowers``
    [6, n_bandpowers] (the input C_l with the beam through the windows) when a CMB
    sky was simulated. The windows [6, n_bandpowers, 6, lmax_b + 2] are the same for
    every realisation of a coupling: they stay in the coupling file (``Coupling.read_npz``
    then ``.bandpower_windows``), named by ``bandpower_mask_sha256`` (the coupling's
    identity) and ``bandpower_coupling_sha256`` (the file's sha256); without a coupling file
    (``--coupling`` not given) nothing else keeps them and they are written here as ``bandpower_windows``;
  - ``monopole`` (K) and ``dipole`` [3] (K) of the I map over the mask, removed
    before every transform;
* ``result.json``  -- :class:`schemas.result.RealizationResult`.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import healpy as hp
import numpy as np

from mapmaker.model.spectra import SPECTRA, RealizationSpectra
from schemas.files import fsync_path, sha256_file
from schemas.programs import MAP_FILES, RESULT_FILE, SPECTRA_FILES, partial_folder_prefix
from schemas.result import ProductFile, RealizationResult


class OutputExists(FileExistsError):
    """``--out`` names something that already exists; products are never overwritten."""


def refuse_existing(out: str | Path) -> None:
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise OutputExists(f"--out {str(out)!r} already exists; refusing to overwrite it (remove it or choose another folder)")


class OutputUnusable(OSError):
    """An output's folder cannot be made or written: said before the run, not after the solve."""


def refuse_unwritable(path: str | Path, option: str) -> None:
    """Raise :class:`OutputUnusable` unless ``path``'s folder exists or can be made, and can be written.

    The nearest existing ancestor of the folder must be a folder this process may write in
    (the missing ones below it are made when the output is written).
    """
    folder = Path(path).absolute().parent
    ancestor = folder
    while not (ancestor.exists() or ancestor.is_symlink()) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputUnusable(f"{option} {str(path)!r}: {str(ancestor)!r} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputUnusable(f"{option} {str(path)!r}: no permission to write in {str(ancestor)!r}")


class ProductFolder:
    """A temporary sibling of ``out`` that :meth:`commit` renames to ``out``."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        refuse_existing(self.out)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=partial_folder_prefix(self.out.name), dir=self.out.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.path, 0o777 & ~umask)  # mkdtemp makes it private; the products are not

    def file(self, name: str) -> Path:
        return self.path / name

    def commit(self) -> Path:
        for item in self.path.iterdir():
            fsync_path(item)
        fsync_path(self.path)
        refuse_existing(self.out)  # rename() would silently replace an empty folder made meanwhile
        os.rename(self.path, self.out)
        fsync_path(self.out.parent)
        return self.out

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def file_record(name: str, path: Path, folder: Path) -> ProductFile:
    """The record of a product file: its role ``name``, path relative to ``folder``, sha256 and size."""
    return ProductFile(name=name, path=str(path.relative_to(folder)), sha256=sha256_file(path), size_bytes=path.stat().st_size)


MAP_PRECISIONS = {"float64": np.float64, "float32": np.float32}


def write_cut_sky(
    path: Path,
    pixels: np.ndarray,
    columns: dict[str, np.ndarray],
    *,
    nside: int,
    coord: str,
    header: list[tuple[str, object]],
    unit: str | None = None,
) -> None:
    """A HEALPix cut-sky FITS file: ``PIXEL`` (RING, int32) [n] and each of ``columns`` [n] as stored.

    The header is healpy's for a partial map (``INDXSCHM = EXPLICIT``, ``OBJECT = PARTIAL``), so
    ``healpy.read_map`` returns the full map with UNSEEN elsewhere. Written here rather than with
    ``healpy.write_map(partial=True)``, which picks the pixels from the first field's UNSEEN values
    (none in an integer hit map) and fails on a small pixel index range.
    """
    from astropy.io import fits  # deferred like healpy

    codes = {np.dtype(np.float64): "D", np.dtype(np.float32): "E", np.dtype(np.int32): "J", np.dtype(np.int64): "K"}
    table = [fits.Column(name="PIXEL", format="J", array=np.asarray(pixels, dtype=np.int32))]
    for name, values in columns.items():
        values = np.asarray(values)
        table.append(fits.Column(name=name, format=codes[values.dtype], array=values, unit=unit))
    hdu = fits.BinTableHDU.from_columns(table)
    cards = [
        ("PIXTYPE", "HEALPIX", "HEALPIX pixelisation"),
        ("ORDERING", "RING", "Pixel ordering scheme, either RING or NESTED"),
        ("COORDSYS", coord, "Ecliptic, Galactic or Celestial (equatorial)"),
        ("EXTNAME", "xtension", "name of this binary table extension"),
        ("NSIDE", int(nside), "Resolution parameter of HEALPIX"),
        ("INDXSCHM", "EXPLICIT", "Indexing: IMPLICIT or EXPLICIT"),
        ("OBJECT", "PARTIAL", "Sky coverage, either FULLSKY or PARTIAL"),
    ]
    for key, value, comment in cards:
        hdu.header[key] = (value, comment)
    for key, value in header:
        hdu.header[key] = value
    fits.HDUList([fits.PrimaryHDU(), hdu]).writeto(path)


def write_maps(
    folder: ProductFolder,
    iqu: np.ndarray,
    hits: np.ndarray,
    rcond: np.ndarray,
    header: list[tuple[str, object]],
    coord: str,
    precision: str = "float64",
) -> list[ProductFile]:
    """Write the three maps in cut-sky form over the observed pixels (``hits > 0``); return their records.

    ``iqu`` [3, npix] (K), ``hits`` [npix], ``rcond`` [npix], RING; ``coord`` "E" ecliptic or "C"
    equatorial; ``precision`` the map's (``MAP_PRECISIONS``). Per observed pixel: 4 bytes of index
    in each file, then 3 x 8 (or 3 x 4) for the map, 4 for the hits and 4 for rcond.
    """
    paths = {role: folder.file(name) for role, name in MAP_FILES.items()}
    nside = hp.npix2nside(np.shape(hits)[-1])
    observed = np.flatnonzero(np.asarray(hits) > 0)
    common = {"nside": nside, "coord": coord, "header": header}
    dtype = MAP_PRECISIONS[precision]
    maps = {name: np.asarray(iqu[field][observed], dtype=dtype) for field, name in enumerate(("I_STOKES", "Q_STOKES", "U_STOKES"))}
    write_cut_sky(paths["iqu"], observed, maps, unit="K", **common)
    write_cut_sky(paths["hits"], observed, {"HITS": np.asarray(hits[observed], dtype=np.int32)}, **common)
    write_cut_sky(paths["rcond"], observed, {"RCOND": np.asarray(rcond[observed], dtype=np.float32)}, **common)
    return [file_record(role, path, folder.path) for role, path in paths.items()]


def write_spectra(
    folder: ProductFolder,
    measured: RealizationSpectra,
    header: list[tuple[str, object]],
    coord: str,
    *,
    with_mask: bool = True,
    coupling_sha256: str | None = None,
) -> list[ProductFile]:
    """Write the spectra (npz) of a realisation, and the mask (FITS) when ``with_mask``; return their records.

    ``coupling_sha256``: the sha256 of the coupling file holding the bandpower windows (None without one).
    """
    roles = SPECTRA_FILES if with_mask else {"spectra": SPECTRA_FILES["spectra"]}
    paths = {role: folder.file(name) for role, name in roles.items()}
    # The mask depends on the pointing only: without the realisation in its header, every
    # realisation of a campaign writes the same bytes (the service checks the checksums agree).
    mask_header = [(key, value) for key, value in header if key != "REALIZ"]
    if with_mask:
        hp.write_map(
            paths["mask"], measured.mask, dtype=np.float64, column_names=["MASK"], extra_header=mask_header, coord=coord
        )
    arrays: dict[str, Any] = {  # by member name; Any so that np.savez(**arrays) type-checks
        "spectra": np.array(SPECTRA),
        "ell": np.arange(measured.lmax + 1),
        "cl": measured.cl,
        "ell_min": measured.ell_min,
        "ell_max": measured.ell_max,
        "cl_binned": measured.binned,
        "w2": np.float64(measured.w2),
        "fsky": np.float64(measured.fsky),
    }
    if measured.model is not None:
        arrays.update(model=measured.model, model_binned=measured.model_binned)
    binning = measured.coupling.binning
    arrays.update(
        bandpowers=measured.bandpowers.cb,
        bandpower_ell=measured.bandpowers.ell_b,
        bandpower_ell_lo=measured.bandpowers.ell_lo,
        bandpower_ell_hi=measured.bandpowers.ell_hi,
        bandpower_mask_sha256=np.str_(measured.coupling.mask_sha256),
        bandpower_coupling_sha256=np.str_(coupling_sha256 or ""),
        **({} if coupling_sha256 else {"bandpower_windows": measured.bandpowers.windows}),
        bandpower_purify_b=np.bool_(measured.coupling.purify_b),
        bandpower_reliable=binning.reliable_bins,
        monopole=np.float64(measured.monopole),
        dipole=measured.dipole,
    )
    if measured.model_bandpowers is not None:
        arrays.update(model_bandpowers=measured.model_bandpowers)
    with open(paths["spectra"], "wb") as handle:
        np.savez(handle, **arrays)
    return [file_record(role, path, folder.path) for role, path in paths.items()]


def write_result(folder: ProductFolder, result: RealizationResult) -> None:
    """``result.json`` into the folder (made durable with the rest by :meth:`ProductFolder.commit`)."""
    folder.file(RESULT_FILE).write_text(result.model_dump_json(indent=2) + "\n")
