"""What one realisation reports when it finishes: ``result.json`` beside its maps.

The record is complete enough to reproduce the realisation: the spec hash,
the RNG key of every random stream, the package versions, and the rank and
thread counts. Times are seconds; sizes are bytes.
"""
from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from schemas.spec import Reduction, ReductionStrategy

RESULT_FORMAT_VERSION = 1

# The stages of a realisation a result times (mapmaker.solve.timing.STAGES, in the order they run).
Stage = Literal["sky", "pointing", "distribution", "simulate", "coarse", "solve", "gather", "products", "write"]


class ResultModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Spread(ResultModel):
    """A per-rank quantity summarised over ranks."""

    max: float
    mean: float


class TimingSplit(ResultModel):
    """Wall-clock split of the whole realisation, per rank, summarised over ranks (seconds)."""

    calc: Spread
    comm: Spread
    io: Spread
    total: float = Field(description="Wall time of the realisation on rank 0, start to finish")


class ModeledStrategy(ResultModel):
    """The alpha-beta model's figures for one strategy (mapmaker.parallel.commodel), slowest rank."""

    bytes_per_iteration: float
    messages_per_iteration: float
    seconds_per_iteration: float
    preprocessing_s: float = Field(description="One-time allgather + sift; 0 for allreduce")
    campaign_s: float = Field(description="Communication of every realisation of the campaign plus the preprocessing")
    threshold: float | None = Field(None, description="hybrid: pixels observed by at least this many ranks are heavy")
    heavy_pixels: float | None = Field(None, description="hybrid: pixels in the compact Allreduce")
    steps: float | None = Field(None, description="butterfly: recursive-doubling steps")
    hidden_s: float | None = Field(None, description="overlap variants: seconds per iteration hidden behind computation")


class StrategySelection(ResultModel):
    """Why the reduction is the one it is: the model's figures for every strategy."""

    requested: str
    chosen: str
    reason: str
    machine: str = Field(description="Where alpha and beta come from (calibration file or the defaults)")
    iterations: int = Field(description="PCG iterations assumed per realisation: min(solver.max_iter, 50)")
    realizations: int = Field(description="Realisations sharing one preprocessing")
    modeled: dict[str, ModeledStrategy] = Field(default_factory=dict)


class CommunicationStats(ResultModel):
    """Traffic of the per-iteration pixel reduction, per rank per reduction call."""

    strategy: ReductionStrategy
    requested: Reduction
    bytes_per_iteration: Spread = Field(description="Bytes sent by one rank in one reduction")
    messages_per_iteration: Spread = Field(description="Messages sent by one rank in one reduction")
    reductions: int = Field(description="Reduction calls made in the whole run")
    bytes_counted: str = Field(description="How bytes are counted for this strategy")
    seconds_per_iteration: Spread | None = Field(
        None, description="Wall time of the pixel reduction per PCG iteration, per rank (s)"
    )
    plan: Literal["file", "memory"] | None = Field(
        None, description="Where the overlap plan came from: realize --plan, or built in memory for this run"
    )
    plan_build_s: float | None = Field(None, description="Seconds to build the plan in memory (allgather + sift)")
    details: dict[str, float] | None = Field(None, description="Strategy parameters (hybrid: threshold, heavy_pixels)")
    selection: StrategySelection | None = Field(None, description="The model's figures behind auto (and hybrid's tau)")


class RngStream(ResultModel):
    """The key of one counter-based (Philox) random stream used by the run."""

    stream: Literal["noise", "sky"]
    key: list[int] = Field(description="Philox 128-bit key as two uint64 words")
    detector: str | None = None
    interval: int | None = None


class KeptFile(ResultModel):
    """Where a product kept at its site lies (site setting ``products.maps = "keep"``): the service holds this, not the bytes."""

    site: str = Field(max_length=128, description="The site that keeps the file")
    path: str = Field(max_length=4096, description="Absolute path of the file in the site's store")


class ProductFile(ResultModel):
    name: str = Field(description="Role of the file: iqu, hits, rcond, spectra, result ...")
    path: str = Field(description="Path relative to the realisation's product folder")
    sha256: str
    size_bytes: int
    kept: KeptFile | None = Field(
        None, description="Kept at the site, not uploaded: where (None: uploaded with the result)"
    )


KEPT_ROLES = ("iqu", "hits", "rcond")  # the maps a site may keep; the spectra and the mask always go to the service


SpectrumName = Literal["TT", "EE", "BB", "TE", "EB", "TB"]
SPECTRA: tuple[SpectrumName, ...] = get_args(SpectrumName)


class DecoupledBandpowers(ResultModel):
    """Decoupled (MASTER) bandpowers of one realisation's masked map (``mapmaker.model.bandpowers``).

    ``cb`` and ``model`` map each of TT, EE, BB, TE, EB, TB to one value per bin (K^2, C_b not
    D_b, beam not deconvolved). Bin k spans ``ell_lo[k] .. ell_hi[k]`` inclusive; its window
    functions are in the coupling file named by ``mask_sha256`` (and ``RealizationSpectra.coupling_sha256``),
    or in ``spectra.npz`` (``bandpower_windows``) of a run without a coupling file.
    """

    ell_lo: list[int] = Field(description="First multipole of each bin")
    ell_hi: list[int] = Field(description="Last multipole of each bin (inclusive)")
    lmax: int = Field(description="Band limit of the harmonic transforms and the coupling (3 nside - 1)")
    bin_width: int
    reliable: list[bool] = Field(description="Bins that end at or below 2 nside, where HEALPix transforms are accurate")
    purify_b: bool = Field(description="Pure-E/pure-B estimator (true) or the standard one")
    cb: dict[str, list[float]] = Field(description="Decoupled bandpowers per bin (K^2)")
    model: dict[str, list[float]] | None = Field(
        None,
        description="The simulated CMB's input C_l with its beam through the bandpower windows (K^2); None without one",
    )
    mask_sha256: str = Field(description="SHA-256 of the analysis mask as little-endian float64: the coupling's identity")
    coupling_source: Literal["file", "built"] = Field(
        description="Where the mode coupling came from: read from realize --coupling, or built by this run"
    )
    coupling_build_s: float | None = Field(None, description="Seconds this run spent building the coupling (None: read)")
    coupling_sha256: str | None = Field(
        None, description="SHA-256 of the coupling file as written or read (None: no --coupling file)"
    )
    coupling_bytes: int | None = Field(None, description="Size of the coupling file (bytes; None: no --coupling file)")
    bandpowers_s: float = Field(description="Seconds for the bandpowers given the coupling (transforms and decoupling)")


class MapBandpowers(ResultModel):
    """What ``python -m mapmaker bandpowers`` writes: the decoupled bandpowers of one map (a user's data map).

    The I map's monopole and dipole over the mask are removed first, as for every realisation, so a data
    map and the campaigns' maps are treated alike. K^2, C_b, beam not deconvolved.
    """

    ell_lo: list[int]
    ell_hi: list[int]
    lmax: int
    bin_width: int
    purify_b: bool
    mask_sha256: str
    nside: int
    cb: dict[str, list[float]] = Field(description="Decoupled bandpowers per bin (K^2), TT EE BB TE EB TB")
    monopole_k: float
    dipole_k: list[float]
    coupling_source: Literal["file", "built"]
    coupling_build_s: float | None = None
    bandpowers_s: float


class BinnedSpectra(ResultModel):
    """Pseudo power spectra of one realisation's masked map, binned in ell (``mapmaker.model.spectra``).

    The I map's monopole and dipole over the mask are removed before the pseudo-spectra and the
    bandpowers are computed (their values are ``monopole_k`` and ``dipole_k``).

    ``cl`` and ``model`` map each of TT, EE, BB, TE, EB, TB to one value per
    bin (K^2, the plain mean over the bin's multipoles, full float precision).
    Bin k spans ``ell_min[k] .. ell_max[k]`` inclusive.
    """

    ell_min: list[int] = Field(description="First multipole of each bin")
    ell_max: list[int] = Field(description="Last multipole of each bin (inclusive)")
    lmax: int
    ell_bin_width: int
    cl: dict[str, list[float]] = Field(description="Pseudo-spectra of (I, Q, U) x mask per bin (K^2)")
    w2: float = Field(description="Mean of mask^2 over the sphere")
    fsky: float = Field(description="Fraction of pixels inside the (unapodised) mask")
    apodization_deg: float
    min_hits: int
    signal: bool = Field(description="The realisation simulated a sky signal")
    noise: bool = Field(description="The realisation simulated noise")
    model: dict[str, list[float]] | None = Field(
        None, description="Binned C_l^in B_l^2 of the simulated CMB sky (K^2, no pixel window); None without one"
    )
    beam_fwhm_arcmin: float | None = Field(None, description="Gaussian beam of the simulated sky")
    monopole_k: float | None = Field(
        None, description="Monopole of the I map over the mask (K), fitted and removed before every transform"
    )
    dipole_k: list[float] | None = Field(
        None,
        description="Dipole vector d of the I map over the mask (K; d . n with n a pixel's unit vector in the map's "
        "frame), fitted with the monopole and removed",
    )
    bandpowers: DecoupledBandpowers | None = Field(None, description="Decoupled bandpowers TT, EE, BB, TE, EB, TB")


class SpectrumEstimate(ResultModel):
    """The preconditioned operator's spectrum as PCG saw it: the extreme Ritz values of ``M^-1 A``.

    From the solve's own step lengths and conjugations (the Lanczos tridiagonal; no operator applied). The
    condition estimate sets PCG's rate, ``2 ((sqrt(kappa) - 1) / (sqrt(kappa) + 1))^k``: at kappa 4 a
    tolerance of 1e-6 takes about 13 iterations whatever the problem's size.
    """

    smallest: float = Field(gt=0, description="Smallest Ritz value of M^-1 A (an upper estimate of its smallest eigenvalue)")
    largest: float = Field(gt=0, description="Largest Ritz value of M^-1 A (a lower estimate of its largest eigenvalue)")
    condition: float = Field(ge=1, description="largest / smallest: a lower estimate of the condition number kappa")


class CoarseRecord(ResultModel):
    """The two-level preconditioner's coarse space in one realisation (``solver.preconditioner = "two-level"``)."""

    columns: int = Field(description="Coarse columns K: 3 x the observed pixels at solver.coarse_nside")
    source: Literal["built", "file"] = Field(
        description="Where the coarse operator (E = Z^T A Z and A Z) came from: built by this run, or read from "
        "realize --coarse-cache"
    )
    set_up_s: float = Field(description="Seconds of the set-up before the first iteration (build or read, and the start)")
    refused: str | None = Field(None, description="Why a --coarse-cache file was refused and the operator rebuilt")
    written: bool = Field(False, description="This run wrote the --coarse-cache file")
    mib_rank0: float = Field(description="Memory of the coarse space on rank 0 (MiB)")


class PreconditionerRecord(ResultModel):
    """The preconditioner one realisation solved with: ``solver.preconditioner``, or what ``auto`` chose."""

    name: Literal["block-diagonal", "two-level", "two-level-additive"]
    why: str = Field(description="Why: the spec, or auto's reason (coarse cache, A Z's size, the solve timings)")
    timed: bool = Field(
        False, description="auto timed this solve beside the coarse cache, to compare the two preconditioners"
    )


class RealizationResult(ResultModel):
    format_version: int = RESULT_FORMAT_VERSION
    realization: int
    spec_hash: str
    scan_key: str
    ranks: int
    rank_hosts: list[str] | None = Field(
        None, description="The node each rank ran on (its MPI processor name), by rank; None from older map-makers"
    )
    threads_per_rank: int
    samples: int
    observed_pixels: int = Field(description="Pixels hit by at least one sample")
    cut_pixels: int = Field(description="Observed pixels left out by the rcond cut")
    iterations: int
    converged: bool
    residual_history: list[float] = Field(description="||r_k|| / ||b|| for k = 0 .. iterations")
    spectrum: SpectrumEstimate | None = Field(
        None, description="The preconditioned operator's extreme Ritz values (None: no iteration, or an older result)"
    )
    timing: TimingSplit
    communication: CommunicationStats
    peak_memory_mb: Spread = Field(description="Peak resident memory per rank (MiB): the RSS high-water mark")
    stages: dict[Stage, Spread] | None = Field(
        None,
        description="Wall seconds per stage of the realisation, per rank, summarised over ranks (a stage a rank "
        "did not run counts 0 there): sky (synthesis or the map read, on rank 0), pointing (each rank's cache), "
        "distribution (pixel owners, the reduction, the 3x3 blocks and cut, the sky's broadcast), simulate (the "
        "TOD simulated and b = P^T N^-1 d), coarse (the two-level set-up), solve (PCG), gather (the maps on rank "
        "0), products (mask, coupling, spectra, bandpowers) and write (the product files). None in results "
        "written before stages were timed",
    )
    kernels: str | None = Field(None, description="Map-maker kernels used: 'fast' (numba + ducc0) or 'numpy' (reference)")
    rng_streams: list[RngStream] = Field(
        default_factory=list,
        description="Keys of the first streams the run drew (the sky first, then noise in time-major order), at most 64",
    )
    rng_scheme: str = Field(description="How stream keys derive from (seed, realisation, detector, interval)")
    rng_streams_total: int | None = Field(
        None, description="Streams the run drew; rng_streams lists the first ones (keys derive from rng_scheme)"
    )
    decomposition: str | None = Field(
        None, description="Fingerprint of which chunks each rank owned (mapmaker.model.decomposition)"
    )
    excluded_samples: int | None = Field(None, description="Samples left out of the solve (in cut pixels)")
    plan_checksum: str | None = None
    versions: dict[str, str]
    products: list[ProductFile] = Field(default_factory=list)
    preconditioner: PreconditionerRecord | None = Field(
        None, description="The preconditioner PCG solved with, and why (what solver.preconditioner = \"auto\" chose)"
    )
    coarse: CoarseRecord | None = Field(None, description="The two-level preconditioner's coarse space (None: block-diagonal)")
    spectra: BinnedSpectra | None = Field(
        None,
        description="Binned pseudo-spectra TT, EE, BB, TE, EB, TB (K^2) of the masked map, its monopole and dipole, "
        "and its decoupled bandpowers",
    )
