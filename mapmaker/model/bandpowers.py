"""Decoupled (MASTER) bandpowers of HEALPix maps on a masked sky, and the Monte Carlo products built on them.

Pure functions on full-sky HEALPix RING arrays; nothing here sees ``comm`` or touches a file by name.
The mode coupling, the pure-B harmonic transforms, the binning and the apodisation are the Simons
Observatory's ``pspy`` (``so_mcm``, ``sph_tools``, ``so_spectra``, ``so_window``; its own tests
compare it with NaMaster); this module chooses their inputs and names their outputs.

Conventions (the known answers are in ``tests/unit/test_bandpowers.py``):

* **Maps**: ``iqu [3, npix]`` in K, I Q U in the HEALPix polarisation convention (healpy's).
  Pixels where the mask is 0 may hold anything (``UNSEEN``): they are zeroed before any transform.
* **Spectra**: rows :data:`SPECTRA` = TT EE BB TE EB TB (healpy's order), C_l in K^2 (not D_l).
* **Multipoles** (pspy's ``lmax`` convention): the harmonic transforms run to ``lmax``; bandpowers
  use the multipoles ``2 .. lmax - 1``; the mode-coupling matrix, and hence the bandpower windows,
  run over ``2 .. lmax + 1``. Windows here start at ell 0, so a model C_l array from ell 0 applies
  to them directly: ``windows [6, n_bins, 6, lmax + 2]``.
* **Default lmax** ``= 3 nside - 1``, the largest pspy allows on a HEALPix map: the whole band a
  HEALPix map carries enters the coupling, so the power between 2 nside and 3 nside is decoupled
  instead of leaking, unmodelled, into the bins below. (With lmax = 2 nside + 2 at nside 32, the
  last bin below 2 nside read TT 7% and EE 18% high over 30 skies; with 3 nside - 1, within its
  Monte Carlo error.) HEALPix quadrature is approximate above about 2 nside (TT and EE read 4-5%
  low there at nside 64), so those bins are the decoupling's buffer and
  :attr:`Binning.reliable_bins` marks the bins that end at or below ``2 nside``.
* **Bandpowers** ``C_b``: mean of C_l over the bin's multipoles, decoupled with the inverse of the
  binned coupling matrix (``type="Cl"`` in pspy). Their expectation is exactly
  ``sum_l W_bl C_l`` with the windows of :attr:`Coupling.bandpower_windows`, whatever the shape
  of C_l inside a bin.
* **Beam and pixel window** are *not* deconvolved: ``C_b`` estimates ``W (b_X b_Y p_X p_Y C^XY)``,
  and :func:`model_bandpowers` applies the beam and pixel window to the model. The coupling then
  depends on the mask and the binning only (built once per scan pattern), and MASTER's
  ``<C_b> = F_b B_b^2 C_b^in`` reads ``<C_b> = F_b model_bandpowers(C^in, beam, pixel window)``.
  pspy applies no HEALPix pixel window, and healpy's ``pixwin`` downloads its tables, so the
  caller passes one when its map needs it.
* **B purification** (``purify_b=True``): pspy's pure estimator (Smith 2006; Grain et al. 2009),
  which purifies E as well as B (pure E costs E modes near the edge: more EE variance at low ell
  than the standard estimator). The window must be smooth at the edge: pspy's "C2" taper (which
  NaMaster calls "C1"), over several pixels (10 deg at nside 64 leaves E -> B below 0.5% of
  the lensing BB up to 1.5 nside; at nside 32 the same 10 deg leaves 10-20%).
* **Threads**: pspy's and healpy's OpenMP threads (the apodisation, the coupling build) spin-wait;
  hold them to the caller's share of the cores (``threadpoolctl.threadpool_limits(n, user_api="openmp")``),
  or a busy machine runs them ten times slower. The a_lm of a realisation are pixell's iterated
  analyses over ducc0's transforms (:func:`iterated_map2alm`), which take ``OMP_NUM_THREADS``. A
  realisation runs all of them on root with its node's cores (:mod:`mapmaker.parallel.rootwork`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property
from typing import IO, Any

import healpy as hp
import numpy as np
from pixell import curvedsky
from pspy import so_map, so_mcm, so_spectra, so_window

# The Monte Carlo products are defined once in campaignlib.montecarlo, where the service's running aggregates use
# them too (the service may not import mapmaker); re-exported here beside the bandpowers they are made of.
from campaignlib.montecarlo import (  # noqa: F401
    bandpower_covariance,
    debiased_bandpowers,
    hartlap_factor,
    mean_and_error,
    noise_bias,
    transfer_function,
)

SPECTRA = ("TT", "EE", "BB", "TE", "EB", "TB")  # rows of every [6, ...] array here (healpy's order)
FIELD_OF_SPECTRUM = {"TT": (0, 0), "EE": (1, 1), "BB": (2, 2), "TE": (0, 1), "EB": (1, 2), "TB": (0, 2)}  # T E B
PSPY_SPECTRA = ["TT", "TE", "TB", "ET", "BT", "EE", "EB", "BE", "BB"]  # pspy's names for one spin-0 + spin-2 field
# Jacobi iterations of every map2alm (healpy's and pspy's default): the window's a_lm and the map's. Fewer would
# cut a realisation's transforms from 35 to 15 or 5, but at nside 512 they move its pure EE and BB in the first bin
# by up to 13% (1) and 27% (0) of their noise level (benchmarks/bench_bandpowers.py --harmonic-iterations 3,1,0,
# results page bandpowers; docs/explanation/scale.md), so the products keep 3.
HARMONIC_ITERATIONS = 3
APODISATION_TYPE = "C2"  # pspy's C2 = x - sin(2 pi x) / (2 pi): zero slope and curvature at the edge (pure B needs it)
COUPLING_FORMAT = 2  # version of the npz layout written by Coupling.write_npz (2 adds the spin windows)
READABLE_COUPLING_FORMATS = (1, 2)  # a format-1 file lacks the spin windows: they are computed when needed


class CouplingMismatch(ValueError):
    """A stored coupling was built for another mask, binning or purification than the one asked for."""


# --------------------------------------------------------------------------- mask


def analysis_mask(
    hits: np.ndarray,
    *,
    apodisation_deg: float,
    min_hits: int = 1,
    solved: np.ndarray | None = None,
    known: Coupling | None = None,
) -> np.ndarray:
    """The apodised analysis mask [npix] float64 in [0, 1] of a scan's hit map.

    ``hits [npix]`` (RING) counts samples per pixel; a pixel is observed when ``hits >= min_hits``
    and, when given, ``solved [npix] bool`` (not cut by the solver). Inside the observed region the
    weight rises from 0 at the edge to 1 at ``apodisation_deg`` (degrees) from it, with pspy's C2
    taper of the distance to the nearest unobserved pixel centre. It depends on the pointing only.
    ``apodisation_deg = 0``, a full sky or an empty one give the binary mask.

    ``known``: a coupling whose mask is returned as it is, instead of tapering again, when it was
    built for this ``apodisation_deg`` (:attr:`Coupling.apodisation_deg`) and is positive on exactly
    the observed pixels: the taper is a function of those two (1.4 s at nside 512 saved per
    realisation that reads its coupling).
    """
    if apodisation_deg < 0:
        raise ValueError(f"apodisation_deg = {apodisation_deg}: must be >= 0")
    observed = np.asarray(hits) >= min_hits
    if solved is not None:
        observed &= np.asarray(solved, dtype=bool)
    if (
        known is not None
        and known.apodisation_deg == apodisation_deg
        and known.mask.shape == observed.shape
        and np.array_equal(known.mask > 0, observed)
    ):
        return known.mask
    binary = healpix_map(observed.astype(np.float64))
    if apodisation_deg == 0 or observed.all() or not observed.any():
        return binary.data
    return np.asarray(so_window.create_apodization(binary, APODISATION_TYPE, apodisation_deg).data, dtype=np.float64)


def mask_checksum(mask: np.ndarray) -> str:
    """SHA-256 (64 hex digits) of the mask's values as little-endian float64: the coupling's identity."""
    return hashlib.sha256(np.ascontiguousarray(mask, dtype="<f8").tobytes()).hexdigest()


def effective_fsky(mask: np.ndarray) -> float:
    """``w2^2 / w4`` (Hivon et al. 2002): the sky fraction whose modes a mask keeps, for Knox errors."""
    mask = np.asarray(mask, dtype=np.float64)
    w2 = float(np.mean(mask**2))
    w4 = float(np.mean(mask**4))
    return w2 * w2 / w4 if w4 > 0 else 0.0


def healpix_map(data: np.ndarray) -> so_map.so_map:
    """A pspy ``so_map`` (HEALPix, RING) holding ``data [npix]`` or ``[3, npix]`` (not copied)."""
    data = np.asarray(data, dtype=np.float64)
    ncomp = 1 if data.ndim == 1 else data.shape[0]
    nside = hp.npix2nside(data.shape[-1])
    wrapped = so_map.healpix_template(ncomp, nside)
    wrapped.data = data
    return wrapped


# --------------------------------------------------------------------------- monopole and dipole


def remove_monopole_dipole(i_map: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """Fit and subtract the monopole and dipole of ``i_map [npix]`` (K) over the observed pixels.

    Returns ``(cleaned [npix], monopole K, dipole [3] K)``; the dipole is the vector ``d`` of
    ``d . n`` (n the unit vector of a pixel centre, healpy's ``pix2vec`` in the map's frame). The fit is
    healpy's ``remove_dipole``: unweighted least squares of ``(1, x, y, z)`` over the pixels where
    ``mask > 0``. Unweighted so the recorded values are the map's own, independent of the
    apodisation; an exact offset plus dipole is removed exactly with any weights. Pixels outside
    the mask are returned as they came (UNSEEN stays UNSEEN).
    """
    i_map = np.asarray(i_map, dtype=np.float64)
    observed = np.asarray(mask) > 0
    if observed.sum() < 4:
        raise ValueError(f"{int(observed.sum())} observed pixels: a monopole and dipole need at least 4")
    fitted, monopole, dipole = hp.remove_dipole(np.where(observed, i_map, hp.UNSEEN), fitval=True, copy=True)
    return np.where(observed, fitted, i_map), float(monopole), np.asarray(dipole, dtype=np.float64)


# --------------------------------------------------------------------------- binning


@dataclass(frozen=True)
class Binning:
    """Linear bins of ``bin_width`` multipoles from ell = 2, over the multipoles ``2 .. lmax - 1``.

    Bin b covers ``[2 + b w, 2 + (b + 1) w - 1]``; the last bin stops at ``lmax - 1`` and may be
    narrower. ``lmax`` is pspy's: the band limit of the transforms and the coupling (module doc).
    ``nside`` is the maps' resolution (for the range of reliable bins and the lmax check).
    """

    nside: int
    bin_width: int
    lmax: int

    def __post_init__(self) -> None:
        if self.bin_width < 1:
            raise ValueError(f"bin_width = {self.bin_width}: must be >= 1")
        if not 3 <= self.lmax <= 3 * self.nside - 1:
            raise ValueError(
                f"lmax = {self.lmax}: must be in [3, 3 nside - 1 = {3 * self.nside - 1}] for nside {self.nside}"
            )

    @classmethod
    def for_nside(cls, nside: int, bin_width: int, lmax: int | None = None) -> Binning:
        """Bins for maps of ``nside``; ``lmax`` defaults to ``3 nside - 1`` (why: the module doc)."""
        return cls(nside=nside, bin_width=bin_width, lmax=3 * nside - 1 if lmax is None else lmax)

    @property
    def ell_lo(self) -> np.ndarray:
        """First multipole of each bin [n_bins] int64."""
        return np.arange(2, self.lmax, self.bin_width, dtype=np.int64)

    @property
    def ell_hi(self) -> np.ndarray:
        """Last multipole of each bin [n_bins] int64 (inclusive, at most lmax - 1)."""
        return np.minimum(self.ell_lo + self.bin_width - 1, self.lmax - 1)

    @property
    def ell_centre(self) -> np.ndarray:
        """Centre of each bin [n_bins] float64: ``(ell_lo + ell_hi) / 2``."""
        return (self.ell_lo + self.ell_hi) / 2.0

    @property
    def n_bins(self) -> int:
        return int(self.ell_lo.size)

    @property
    def reliable_bins(self) -> np.ndarray:
        """[n_bins] bool: bins that end at or below ``2 nside``, where HEALPix transforms are accurate."""
        return self.ell_hi <= 2 * self.nside

    def pspy_binning(self) -> list[str]:
        """The bins as the lines of a pspy binning file (``low high centre``); numpy reads a list as a file."""
        return [f"{lo} {hi} {centre}" for lo, hi, centre in zip(self.ell_lo, self.ell_hi, self.ell_centre)]


# --------------------------------------------------------------------------- coupling


@dataclass(frozen=True, eq=False)
class Coupling:
    """The mask, the binning and pspy's inverse binned mode-coupling matrices and bandpower windows.

    ``mode_coupling_inv`` and ``pspy_windows`` are pspy's dictionaries keyed by spin pair:
    ``spin0xspin0``, ``spin0xspin2``, ``spin2xspin0`` ``[n_bins, n_bins]`` / ``[n_bins, lmax]`` and
    ``spin2xspin2`` ``[4 n_bins, 4 n_bins]`` / ``[4 n_bins, 4 lmax]`` (blocks EE EB BE BB); window
    columns are ell = 2 .. lmax + 1. Build with :func:`build_coupling`; store with
    :meth:`write_npz`, reload with :meth:`read_npz`. ``stored_spin_windows`` are the mask's
    :func:`spinned_windows` (``[4, npix]``, pure estimator only) when they came with it; None otherwise
    (:attr:`spin_windows` computes them). ``apodisation_deg`` is the taper's scale when the mask is
    :func:`analysis_mask`'s (None: not known, and the mask is never taken for one).
    """

    mask: np.ndarray  # [npix] float64, the apodised analysis mask
    binning: Binning
    purify_b: bool
    mode_coupling_inv: dict[str, np.ndarray]
    pspy_windows: dict[str, np.ndarray]
    stored_spin_windows: np.ndarray | None = None
    apodisation_deg: float | None = None

    @cached_property
    def spin_windows(self) -> np.ndarray:
        """The mask's :func:`spinned_windows` ``[4, npix]`` to the binning's ``lmax`` (the pure a_lm's)."""
        if self.stored_spin_windows is not None:
            return self.stored_spin_windows
        return spinned_windows(self.mask, self.binning.lmax)

    @cached_property
    def mask_sha256(self) -> str:
        return mask_checksum(self.mask)

    @property
    def nside(self) -> int:
        return self.binning.nside

    @cached_property
    def bandpower_windows(self) -> np.ndarray:
        """``W [6, n_bins, 6, lmax + 2]``: ``<C_b^X> = sum_Y sum_l W[X, b, Y, l] C_l^Y`` (rows :data:`SPECTRA`, ell from 0).

        Each spectrum's own window, plus the polarisation mixing that remains after decoupling
        (EE <- BB, BB <- EE, ...). EB stands for EB and BE (equal for an auto-spectrum): its
        column is the sum of pspy's EB and BE columns and its row their mean; TE and TB likewise
        take the mean of pspy's TE and ET (TB and BT) windows.
        """
        n_bins, lmax = self.binning.n_bins, self.binning.lmax
        windows = np.zeros((6, n_bins, 6, lmax + 2))
        cols = slice(2, lmax + 2)
        tt, ee, bb, te, eb, tb = range(6)
        windows[tt, :, tt, cols] = self.pspy_windows["spin0xspin0"]
        spin0_spin2 = 0.5 * (self.pspy_windows["spin0xspin2"] + self.pspy_windows["spin2xspin0"])
        windows[te, :, te, cols] = spin0_spin2
        windows[tb, :, tb, cols] = spin0_spin2
        polarisation = self.pspy_windows["spin2xspin2"]

        def block(row: int, col: int) -> np.ndarray:  # pspy's blocks: 0 EE, 1 EB, 2 BE, 3 BB
            return polarisation[row * n_bins : (row + 1) * n_bins, col * lmax : (col + 1) * lmax]

        def pspy_row(row: int) -> dict[int, np.ndarray]:  # one pspy row's windows on our EE, EB (= EB + BE), BB
            return {ee: block(row, 0), eb: block(row, 1) + block(row, 2), bb: block(row, 3)}

        for ours, pspy_rows in ((ee, (0,)), (bb, (3,)), (eb, (1, 2))):
            for target in (ee, eb, bb):
                windows[ours, :, target, cols] = np.mean([pspy_row(row)[target] for row in pspy_rows], axis=0)
        return windows

    def write_npz(self, handle: IO[bytes] | str) -> None:
        """Write the coupling as an npz of arrays only (fits ``schemas.files.atomic_write(path, coupling.write_npz)``).

        With the pure estimator the spin windows go in too, over the pixels where the mask is positive
        (``spin_windows [4, n_observed]``): the pure a_lm read them nowhere else.
        """
        matrices: dict[str, Any] = {  # by member name; Any so that np.savez(**matrices) type-checks
            **{f"mode_coupling_inv_{pair}": matrix for pair, matrix in self.mode_coupling_inv.items()},
            **{f"windows_{pair}": matrix for pair, matrix in self.pspy_windows.items()},
        }
        if self.purify_b:
            matrices["spin_windows"] = self.spin_windows[:, self.mask > 0]
        if self.apodisation_deg is not None:
            matrices["apodisation_deg"] = np.float64(self.apodisation_deg)
        np.savez(
            handle,
            format=np.int64(COUPLING_FORMAT),
            mask=self.mask,
            mask_sha256=np.str_(self.mask_sha256),
            nside=np.int64(self.binning.nside),
            bin_width=np.int64(self.binning.bin_width),
            lmax=np.int64(self.binning.lmax),
            purify_b=np.bool_(self.purify_b),
            **matrices,
        )

    @classmethod
    def read_npz(
        cls,
        handle: IO[bytes] | str,
        *,
        mask_sha256: str | None = None,
        binning: Binning | None = None,
        purify_b: bool | None = None,
    ) -> Coupling:
        """Read a coupling written by :meth:`write_npz`, refusing one that differs from what is expected.

        ``mask_sha256`` (of the analysis mask in hand, :func:`mask_checksum`), ``binning`` and
        ``purify_b``, when given, must match what the coupling was built for, else
        :class:`CouplingMismatch` names what differs. The stored mask is checked against its
        stored checksum as well (a damaged file is refused the same way).
        """
        with np.load(handle, allow_pickle=False) as stored:
            if int(stored["format"]) not in READABLE_COUPLING_FORMATS:
                raise CouplingMismatch(
                    f"coupling file format {int(stored['format'])}, this code reads {READABLE_COUPLING_FORMATS}"
                )
            mask = np.array(stored["mask"], dtype=np.float64)
            stored_sha256 = str(stored["mask_sha256"])
            spin_windows = None
            if "spin_windows" in stored.files:
                observed = mask > 0
                shape = (4, int(np.count_nonzero(observed)))
                if stored["spin_windows"].shape != shape:
                    raise CouplingMismatch(
                        f"its spin_windows have shape {stored['spin_windows'].shape}, not {shape} (damaged file)"
                    )
                spin_windows = np.zeros((4, mask.size))
                spin_windows[:, observed] = stored["spin_windows"]
            coupling = cls(
                mask=mask,
                binning=Binning(
                    nside=int(stored["nside"]), bin_width=int(stored["bin_width"]), lmax=int(stored["lmax"])
                ),
                purify_b=bool(stored["purify_b"]),
                mode_coupling_inv={
                    k.removeprefix("mode_coupling_inv_"): np.array(stored[k])
                    for k in stored.files
                    if k.startswith("mode_coupling_inv_")
                },
                pspy_windows={
                    k.removeprefix("windows_"): np.array(stored[k]) for k in stored.files if k.startswith("windows_")
                },
                stored_spin_windows=spin_windows,
                apodisation_deg=float(stored["apodisation_deg"]) if "apodisation_deg" in stored.files else None,
            )
        damaged = coupling.mask_sha256 != stored_sha256
        differences = [f"its mask's sha256 is {coupling.mask_sha256} but it records {stored_sha256} (damaged file)"]
        coupling.refuse_unless(
            mask_sha256=mask_sha256, binning=binning, purify_b=purify_b, differences=differences if damaged else []
        )
        return coupling

    def refuse_unless(
        self,
        *,
        mask_sha256: str | None = None,
        binning: Binning | None = None,
        purify_b: bool | None = None,
        differences: list[str] | None = None,
    ) -> None:
        """Raise :class:`CouplingMismatch` naming every difference from what is given (None: not checked);
        ``differences`` are found earlier (a damaged file) and reported with them."""
        differences = list(differences or [])
        if mask_sha256 is not None and mask_sha256 != self.mask_sha256:
            differences.append(f"built for the mask with sha256 {self.mask_sha256}, not {mask_sha256}")
        if binning is not None and binning != self.binning:
            differences.append(f"built for {self.binning}, not {binning}")
        if purify_b is not None and purify_b != self.purify_b:
            differences.append(f"built with purify_b={self.purify_b}, not purify_b={purify_b}")
        if differences:
            raise CouplingMismatch(
                "coupling refused: " + "; ".join(differences) + ". Rebuild it for this mask and binning."
            )


def build_coupling(
    mask: np.ndarray, binning: Binning, *, purify_b: bool = True, apodisation_deg: float | None = None
) -> Coupling:
    """pspy's spin-0 and spin-2 coupling of ``mask [npix]`` (the same window for T and P), binned by ``binning``.

    ``purify_b`` selects the pure-E/pure-B coupling (``mcm_and_bbl_spin0and2(..., pure=True)``);
    the bandpowers must then be computed with pure a_lm, which :func:`decoupled_bandpowers` does
    for a coupling built so. Cost: O(lmax^3) once per mask and binning. ``apodisation_deg``: the taper's
    scale when ``mask`` is :func:`analysis_mask`'s, so that later realisations take the mask from it.
    """
    mask = np.asarray(mask, dtype=np.float64)
    if hp.npix2nside(mask.size) != binning.nside:
        raise ValueError(f"mask of nside {hp.npix2nside(mask.size)}, binning for nside {binning.nside}")
    if not np.any(mask > 0):
        raise ValueError("the mask is empty: nothing to couple")
    window = healpix_map(mask)
    mode_coupling_inv, pspy_windows = so_mcm.mcm_and_bbl_spin0and2(
        (window, window),
        binning.pspy_binning(),
        lmax=binning.lmax,
        niter=HARMONIC_ITERATIONS,
        type="Cl",
        pure=purify_b,
    )
    return Coupling(
        mask=mask,
        binning=binning,
        purify_b=purify_b,
        mode_coupling_inv=mode_coupling_inv,
        pspy_windows=pspy_windows,
        stored_spin_windows=spinned_windows(mask, binning.lmax) if purify_b else None,
        apodisation_deg=apodisation_deg,
    )


# --------------------------------------------------------------------------- bandpowers


@dataclass(frozen=True, eq=False)
class Bandpowers:
    """Decoupled bandpowers of one map: ``cb [6, n_bins]`` K^2 (rows :data:`SPECTRA`) at ``ell_b [n_bins]``.

    ``windows`` is the coupling's ``[6, n_bins, 6, lmax + 2]`` (shared, not copied):
    ``<cb> = einsum("xbyl,yl->xb", windows, C_l)``.
    """

    ell_lo: np.ndarray  # [n_bins] int64
    ell_hi: np.ndarray  # [n_bins] int64
    ell_b: np.ndarray  # [n_bins] float64, bin centres
    cb: np.ndarray  # [6, n_bins] K^2
    windows: np.ndarray  # [6, n_bins, 6, lmax + 2]


def masked_alms(
    iqu: np.ndarray, coupling: Coupling, iterations: int = HARMONIC_ITERATIONS
) -> tuple[np.ndarray, np.ndarray]:
    """The a_lm of ``iqu [3, npix]`` (K) on the coupling's mask, to ``lmax``: ``(alms, plain)``, each [3, n_alm] complex128.

    ``alms`` (T, E, B) are what the bandpowers decouple: pure E and B when ``coupling.purify_b``
    (pspy's ``sph_tools.get_pure_alms``, term for term), else the plain ones (its ``get_alms``). ``plain`` are the a_lm of
    the mask times the map, whose spectra are the pseudo-spectra (healpy's ``anafast`` of it with the
    same iterations, to round-off). The pure estimator computes them on its way (its T and its spin-2
    term), so a realisation's pseudo-spectra cost no transform of their own. ``iterations``: the Jacobi
    iterations of every analysis (:func:`iterated_map2alm`).
    """
    iqu = np.asarray(iqu, dtype=np.float64)
    mask = coupling.mask
    if iqu.shape != (3, mask.size):
        raise ValueError(f"iqu has shape {iqu.shape}, expected (3, {mask.size}) for the coupling's mask")
    observed = np.where(mask > 0, iqu, 0.0)  # UNSEEN outside must not meet the pure windows' ringing
    lmax = coupling.binning.lmax
    if not coupling.purify_b:  # pspy's get_alms: the T and spin-2 analyses of the mask times the map
        weighted = observed * mask
        plain = np.concatenate(
            [iterated_map2alm(weighted[:1], spin=0, lmax=lmax, iterations=iterations),
             iterated_map2alm(weighted[1:], spin=2, lmax=lmax, iterations=iterations)]
        )
        return plain, plain
    return _pure_and_plain_alms(observed, mask, coupling.spin_windows, lmax, iterations)


def _pure_and_plain_alms(
    observed: np.ndarray, mask: np.ndarray, spin_windows: np.ndarray, lmax: int, iterations: int = HARMONIC_ITERATIONS
) -> tuple[np.ndarray, np.ndarray]:
    """pspy's ``get_pure_alms`` for a HEALPix map (Smith 2006 pure E and B: the spin-2, spin-1 and spin-0
    terms of the map times the window's spin derivatives), returning its plain T and spin-2 a_lm as well.

    ``observed [3, npix]`` (K, zero where ``mask [npix]`` is 0), ``spin_windows [4, npix]`` the mask's
    :func:`spinned_windows` (read where the mask is positive only); returns ``(pure, plain)``, each
    ``[3, n_alm]`` complex128 to ``lmax`` (T, E, B). The terms are pspy 1.8's, each iterated analysis
    (:func:`iterated_map2alm`) made by pixell's Jacobi iterations over ducc0's transforms, as pspy's own
    spin-1 and spin-2 terms are: the same a_lm as ``sph_tools.get_pure_alms`` to round-off (the tests
    compare them), at a third of the time of healpy's iterated ``map2alm`` for the spin-0 ones.
    """
    w1_plus, w1_minus, w2_plus, w2_minus = spin_windows
    q, u = observed[1], observed[2]
    p2 = np.array([mask * q, mask * u])
    p1 = np.array([w1_plus * q + w1_minus * u, w1_plus * u - w1_minus * q])
    p0 = np.array([w2_plus * q + w2_minus * u, w2_plus * u - w2_minus * q])
    # T and the spin-0 terms
    scalar = iterated_map2alm(np.array([observed[0] * mask, p0[0], p0[1]]), spin=0, lmax=lmax, iterations=iterations)
    spin2 = iterated_map2alm(p2, spin=2, lmax=lmax, iterations=iterations)
    spin1 = iterated_map2alm(p1, spin=1, lmax=lmax, iterations=iterations)
    spin0 = scalar[1:]
    ell = np.arange(lmax + 1)
    filter_1, filter_2 = np.zeros(lmax + 1), np.zeros(lmax + 1)
    filter_1[2:] = 2 * np.sqrt(1.0 / ((ell[2:] + 2.0) * (ell[2:] - 1.0)))
    filter_2[2:] = np.sqrt(1.0 / ((ell[2:] + 2.0) * (ell[2:] + 1.0) * ell[2:] * (ell[2:] - 1.0)))
    for k in range(2):
        spin1[k] = hp.almxfl(spin1[k], filter_1)
        spin0[k] = hp.almxfl(spin0[k], filter_2)
    alm_t = scalar[0]
    pure = np.array([alm_t, spin2[0] + spin1[0] + spin0[0], spin2[1] + spin1[1] + spin0[1]])
    return pure, np.array([alm_t, spin2[0], spin2[1]])


def spinned_windows(mask: np.ndarray, lmax: int) -> np.ndarray:
    """The window's spin-1 and spin-2 derivatives ``[4, npix]`` float64 (w1+, w1-, w2+, w2-) to ``lmax``.

    pspy's ``so_window.get_spinned_windows`` for a HEALPix window ``mask [npix]``, its analysis made by
    :func:`iterated_map2alm` and its syntheses by pixell as pspy's are: the same maps to round-off.
    They depend on the mask only, so a coupling file keeps them (:attr:`Coupling.spin_windows`).
    """
    wlm = iterated_map2alm(np.asarray(mask, dtype=np.float64)[None], spin=0, lmax=lmax)[0]
    ell = np.arange(lmax + 1)
    filter_1 = -np.sqrt((ell + 1.0) * ell)
    filter_2 = np.sqrt((ell + 2.0) * (ell + 1.0) * ell * (ell - 1.0))
    filter_2[:1] = 0
    windows = np.empty((4, np.size(mask)))
    for spin, (filter_, rows) in ((1, (filter_1, slice(0, 2))), (2, (filter_2, slice(2, 4)))):
        alm = np.array([hp.almxfl(wlm, filter_), np.zeros_like(wlm)])  # E from the window, no B
        curvedsky.alm2map_healpix(alm, windows[rows], spin=spin)
    return windows


def iterated_map2alm(maps: np.ndarray, *, spin: int, lmax: int, iterations: int = HARMONIC_ITERATIONS) -> np.ndarray:
    """a_lm ``[k, n_alm]`` complex128 to ``lmax`` of HEALPix RING maps ``maps [k, npix]`` of one ``spin``.

    Spin 0: each map on its own (healpy's ``map2alm(iter=iterations)``, to round-off); spin 1
    or 2: ``k = 2``, the (+, -) pair's E and B (pixell's sign convention, pspy's). Quadrature weights
    ``4 pi / npix`` with ``iterations`` Jacobi iterations (pixell's ``niter``; each adds a synthesis and an
    analysis to the first analysis), ducc0's transforms on ``OMP_NUM_THREADS`` threads (all cores when unset;
    :mod:`mapmaker.parallel.rootwork`).
    """
    return curvedsky.map2alm_healpix(np.asarray(maps, dtype=np.float64), spin=spin, lmax=lmax, niter=iterations)


def decoupled_bandpowers(iqu: np.ndarray, coupling: Coupling, iterations: int = HARMONIC_ITERATIONS) -> Bandpowers:
    """TT EE BB TE EB TB bandpowers of ``iqu [3, npix]`` (K) on the coupling's mask, decoupled.

    The masked maps' a_lm (pure E and B a_lm when ``coupling.purify_b``; :func:`masked_alms` with
    ``iterations``) to ``lmax``, then :func:`bandpowers_of_alms`. The beam and pixel window stay in (module doc).
    """
    return bandpowers_of_alms(masked_alms(iqu, coupling, iterations)[0], coupling)


def bandpowers_of_alms(alms: np.ndarray, coupling: Coupling) -> Bandpowers:
    """The decoupled bandpowers of the a_lm ``alms [3, n_alm]`` (T, E, B to the binning's ``lmax``,
    :func:`masked_alms`): their pseudo-spectra, binned and multiplied by the inverse binned coupling
    (pspy's ``bin_spectra``)."""
    lmax = coupling.binning.lmax
    ell, pseudo = so_spectra.get_spectra(alms, spectra=PSPY_SPECTRA)
    _, binned = so_spectra.bin_spectra(
        ell,
        pseudo,
        coupling.binning.pspy_binning(),
        lmax,
        type="Cl",
        mbb_inv=coupling.mode_coupling_inv,
        spectra=PSPY_SPECTRA,
    )
    cb = np.stack(
        [
            binned["TT"],
            binned["EE"],
            binned["BB"],
            0.5 * (binned["TE"] + binned["ET"]),
            0.5 * (binned["EB"] + binned["BE"]),
            0.5 * (binned["TB"] + binned["BT"]),
        ]
    )
    binning = coupling.binning
    return Bandpowers(
        ell_lo=binning.ell_lo,
        ell_hi=binning.ell_hi,
        ell_b=binning.ell_centre,
        cb=cb,
        windows=coupling.bandpower_windows,
    )


def model_bandpowers(
    coupling: Coupling,
    cl: np.ndarray,
    *,
    beam_fwhm_arcmin: float | None = None,
    pixel_window: np.ndarray | None = None,
) -> np.ndarray:
    """The expected bandpowers ``[6, n_bins]`` K^2 of a sky with spectra ``cl`` seen through the coupling.

    ``cl [4 or 6, n_ell]`` K^2, rows TT EE BB TE (EB TB), from ell = 0; multipoles beyond its end
    count as zero (a band-limited sky), beyond ``lmax + 1`` are ignored. ``beam_fwhm_arcmin``: a
    Gaussian beam (healpy's ``gauss_beam(pol=True)``: T, E, B beams; spectrum XY takes b_X b_Y).
    ``pixel_window [2, >= lmax + 2]``: T and P pixel windows as ``healpy.pixwin(nside, pol=True)``
    returns them, for maps whose pixels average the sky (a data map); a simulated sky evaluated at
    pixel centres has none.
    """
    cl = np.atleast_2d(np.asarray(cl, dtype=np.float64))
    if cl.shape[0] not in (4, 6):
        raise ValueError(f"cl has {cl.shape[0]} rows: expected 4 (TT EE BB TE) or 6 (TT EE BB TE EB TB)")
    n_ell = coupling.binning.lmax + 2
    model = np.zeros((6, n_ell))
    kept = min(n_ell, cl.shape[1])
    model[: cl.shape[0], :kept] = cl[:, :kept]
    field_transfer = np.ones((3, n_ell))  # T E B
    if beam_fwhm_arcmin is not None:
        field_transfer *= hp.gauss_beam(math.radians(beam_fwhm_arcmin / 60.0), lmax=n_ell - 1, pol=True)[:, :3].T
    if pixel_window is not None:
        pixel_window = np.asarray(pixel_window, dtype=np.float64)
        if pixel_window.ndim != 2 or pixel_window.shape[0] != 2 or pixel_window.shape[1] < n_ell:
            raise ValueError(f"pixel_window has shape {pixel_window.shape}: expected (2, >= {n_ell}) (T, P)")
        field_transfer *= pixel_window[[0, 1, 1], :n_ell]
    for row, name in enumerate(SPECTRA):
        x, y = FIELD_OF_SPECTRUM[name]
        model[row] *= field_transfer[x] * field_transfer[y]
    return np.einsum("xbyl,yl->xb", coupling.bandpower_windows, model)
