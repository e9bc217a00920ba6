"""Products of one realisation, written by root into a folder that appears whole or not at all.

Everything is written into a hidden temporary sibling of ``--out``
(``.NAME.partial-XXXX``) and the folder is renamed to ``--out`` at the very
end, so a killed run never leaves a folder that looks complete.

Files (HEALPix RING, full sky, readable with ``healpy.read_map``):

* ``map_iqu.fits`` -- I, Q, U (K); UNSEEN where unobserved or cut by rcond;
* ``hits.fits``    -- samples per pixel (int64; 0 where unobserved);
* ``rcond.fits``   -- reciprocal condition number of the geometric 3x3
  hit matrix; UNSEEN where unobserved;
* ``mask.fits``    -- the apodised analysis mask of the spectra (``mapmaker.model.spectra``);
  it depends on the pointing only, so it is the same in every realisation;
* ``spectra.npz``  -- rows TT, EE, BB, TE, EB, TB (``spectra``) everywhere, K^2:

  - pseudo-spectra: ``cl`` [6, lmax + 1] and ``cl_binned`` [6, n_bins],
    ``ell_min``/``ell_max`` of the bins, ``w2``, ``fsky``, and
    ``model``/``model_binned`` (C_l^in B_l^2) when a CMB sky was simulated;
  - decoupled bandpowers (``mapmaker.model.bandpowers``): ``bandpowers``
    [6, n_bandpowers], ``bandpower_ell`` [n_bandpowers] (bin centres),
    ``bandpower_ell_lo``/``bandpower_ell_hi``, ``bandpower_windows``
    [6, n_bandpowers, 6, lmax_b + 2] (``<C_b^X> = sum_Y sum_l W[X, b, Y, l] C_l^Y``,
    ell from 0), ``bandpower_purify_b``, ``bandpower_reliable`` [n_bandpowers] bool,
    and ``model_bandpowers`` [6, n_bandpowers] (the input C_l with the beam
    through the windows) when a CMB sky was simulated;
  - ``monopole`` (K) and ``dipole`` [3] (K) of the I map over the mask, removed
    before every transform;
* ``result.json``  -- :class:`schemas.result.RealizationResult`.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import healpy as hp
import numpy as np

from mapmaker.model.spectra import SPECTRA, RealizationSpectra
from schemas.files import fsync_path, sha256_file
from schemas.programs import MAP_FILES, RESULT_FILE, SPECTRA_FILES
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
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-", dir=self.out.parent))
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


def write_maps(
    folder: ProductFolder,
    iqu: np.ndarray,
    hits: np.ndarray,
    rcond: np.ndarray,
    header: list[tuple[str, object]],
    coord: str,
) -> list[ProductFile]:
    """Write the three maps (``coord``: "E" ecliptic or "C" equatorial); return their records (sha256, size)."""
    paths = {role: folder.file(name) for role, name in MAP_FILES.items()}
    common = {"extra_header": header, "coord": coord}
    hp.write_map(
        paths["iqu"], iqu, dtype=np.float64, column_names=["I_STOKES", "Q_STOKES", "U_STOKES"],
        column_units="K", **common,
    )
    hp.write_map(paths["hits"], np.asarray(hits, dtype=np.int64), dtype=np.int64, column_names=["HITS"], **common)
    hp.write_map(paths["rcond"], rcond, dtype=np.float64, column_names=["RCOND"], **common)
    return [file_record(role, path, folder.path) for role, path in paths.items()]


def write_spectra(
    folder: ProductFolder, measured: RealizationSpectra, header: list[tuple[str, object]], coord: str
) -> list[ProductFile]:
    """Write the mask (FITS) and the spectra (npz) of a realisation; return their records."""
    paths = {role: folder.file(name) for role, name in SPECTRA_FILES.items()}
    # The mask depends on the pointing only: without the realisation in its header, every
    # realisation of a campaign writes the same bytes (the service checks the checksums agree).
    mask_header = [(key, value) for key, value in header if key != "REALIZ"]
    hp.write_map(
        paths["mask"], measured.mask, dtype=np.float64, column_names=["MASK"], extra_header=mask_header, coord=coord
    )
    arrays = {
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
        bandpower_windows=measured.bandpowers.windows,
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
