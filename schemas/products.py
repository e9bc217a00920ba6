"""Monte Carlo products of a campaign as the API reports them (``GET /api/v1/campaigns/{id}/products``).

Spectra are in K^2, binned in ell (bin k spans ``ell_min[k] .. ell_max[k]``
inclusive; a binned value is the plain mean of C_l over the bin). ``std`` is
the sample standard deviation over realisations (ddof = 1), i.e. the scatter
of one realisation; the uncertainty of a mean is ``std / sqrt(n)``. Values
that do not exist (a standard deviation before two realisations, F_l where
the input spectrum is 0) are null.

Definitions (``mapmaker.model.spectra`` for the mask and the pseudo-spectra):

* ``w2 = mean over the sphere of mask^2`` of the apodised analysis mask;
* noise bias (noise-only campaigns): ``N_l = <C~_l> / w2``, the mean
  pseudo-spectrum deconvolved by w2, i.e. the full-sky-equivalent noise
  spectrum (for white noise ``Omega_pix * sum(mask^2 var_p) / sum(mask^2)``);
  the pseudo-spectrum bias to subtract from a masked map's spectrum is
  ``w2 N_l``;
* transfer function (signal-only campaigns with a CMB sky):
  ``F_l = <C~_l> / (w2 C_l^in B_l^2)`` for TT, EE, BB, with ``C_l^in B_l^2``
  binned the same way; no pixel window (the simulated sky is sampled at pixel
  centres).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.result import SpectrumName
from schemas.spec import CampaignKind

DownloadFormat = Literal["fits", "npz", "json"]
MapFormat = Literal["fits", "npz"]

NOISE_BIAS_DEFINITION = (
    "N_l = <C~_l> / w2: mean pseudo-spectrum of the noise-only maps, deconvolved by w2 = mean(mask^2)"
)
TRANSFER_DEFINITION = (
    "F_l = <C~_l> / (w2 C_l^in B_l^2): mean pseudo-spectrum of the signal-only maps over the binned input "
    "spectrum times the Gaussian beam squared and w2 = mean(mask^2); no pixel window (pixel-centre sampling)"
)


class ProductsModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EllBins(ProductsModel):
    ell_min: list[int]
    ell_max: list[int]
    ell_center: list[float]
    lmax: int
    ell_bin_width: int


class MaskInfo(ProductsModel):
    w2: float = Field(description="Mean of mask^2 over the sphere")
    fsky: float = Field(description="Fraction of pixels inside the binary mask")
    apodization_deg: float
    min_hits: int
    stored: bool = Field(description="The mask file is stored with the campaign (download it)")
    sha256: str | None = None
    from_realization: int | None = None


class SpectrumStats(ProductsModel):
    mean: list[float] = Field(description="Mean pseudo-spectrum per bin (K^2)")
    std: list[float] | None = Field(None, description="Scatter of one realisation per bin (K^2); null below 2")


class CorrectionStats(ProductsModel):
    value: list[float | None]
    std: list[float | None] | None = Field(None, description="Scatter of one realisation's estimate")
    error: list[float | None] | None = Field(None, description="Uncertainty of the value: std / sqrt(n)")


class NoiseBias(ProductsModel):
    definition: str = NOISE_BIAS_DEFINITION
    spectra: dict[SpectrumName, CorrectionStats] = Field(description="N_l per spectrum (K^2)")


class TransferFunction(ProductsModel):
    definition: str = TRANSFER_DEFINITION
    beam_fwhm_arcmin: float | None
    pixel_window: Literal["none"] = "none"
    model: dict[SpectrumName, list[float]] = Field(description="Binned C_l^in B_l^2 (K^2)")
    spectra: dict[Literal["TT", "EE", "BB"], CorrectionStats] = Field(description="F_l per spectrum (dimensionless)")


BANDPOWER_TRANSFER_DEFINITION = (
    "<C_b> = F_b B_b^2 C_b^in: F_b is the mean decoupled bandpower of the signal-only maps over the input C_l "
    "with the beam through the bandpower windows (MASTER); error = std / sqrt(n) / (B_b^2 C_b^in)"
)
BANDPOWER_NOISE_DEFINITION = "N_b = <C_b>: mean decoupled bandpower of the noise-only maps; error = std / sqrt(n)"
BANDPOWER_COVARIANCE_DEFINITION = (
    "Sample covariance (ddof 1) of one signal+noise realisation's decoupled bandpowers over the flattened "
    "[6 n_bins] (spectrum-major: index s * n_bins + b); multiply its inverse by hartlap = (n - p - 2) / (n - 1)"
)


class BandpowerBins(ProductsModel):
    ell_lo: list[int] = Field(description="First multipole of each bin")
    ell_hi: list[int] = Field(description="Last multipole of each bin (inclusive)")
    ell_center: list[float]
    lmax: int = Field(description="Band limit of the harmonic transforms and the coupling (3 nside - 1)")
    bin_width: int
    reliable: list[bool] = Field(description="Bins that end at or below 2 nside, where HEALPix transforms are accurate")


class BandpowerEstimate(ProductsModel):
    value: list[float | None] = Field(description="One value per bin")
    error: list[float | None] | None = Field(None, description="Monte Carlo error of the value; null below 2")


class BandpowerCovariance(ProductsModel):
    definition: str = BANDPOWER_COVARIANCE_DEFINITION
    n: int = Field(description="Realisations behind the covariance")
    p: int = Field(description="Bandpowers it covers: 6 n_bins")
    hartlap: float | None = Field(description="(n - p - 2) / (n - 1) for the whole matrix; null when n <= p + 2")
    std: dict[SpectrumName, list[float]] = Field(description="Square root of the diagonal: one realisation's scatter")


class BandpowerProducts(ProductsModel):
    """The campaign's decoupled (MASTER) bandpowers over its realisations (K^2, C_b not D_b, beam not deconvolved)."""

    n: int = Field(description="Realisations whose bandpowers are in the aggregates")
    bins: BandpowerBins
    purify_b: bool
    mask_sha256: str = Field(description="SHA-256 of the analysis mask the coupling was built for")
    mean: dict[SpectrumName, BandpowerEstimate] = Field(description="Mean bandpower and its Monte Carlo error")
    model: dict[SpectrumName, list[float]] | None = Field(
        None, description="Input C_l with the beam through the bandpower windows (K^2); null without a CMB sky"
    )
    beam_fwhm_arcmin: float | None = None
    transfer_function: dict[SpectrumName, BandpowerEstimate] | None = Field(
        None, description="F_b per bandpower (signal-only campaigns): " + BANDPOWER_TRANSFER_DEFINITION
    )
    noise_bias: dict[SpectrumName, BandpowerEstimate] | None = Field(
        None, description="N_b per bandpower (noise-only campaigns, K^2): " + BANDPOWER_NOISE_DEFINITION
    )
    covariance: BandpowerCovariance | None = Field(
        None, description="Bandpower covariance (signal+noise campaigns, two realisations or more); the matrix "
        "itself is in the bandpowers download"
    )


class ProductDownloads(ProductsModel):
    """Paths (under the API prefix) of the downloads that exist now; add ``?format=fits|npz|json``."""

    spectra: str | None = None
    bandpowers: str | None = None
    mean_map: str | None = None
    variance_map: str | None = None
    mask: str | None = None


class ProductsSummary(ProductsModel):
    campaign_id: int
    kind: CampaignKind
    campaign_state: str
    succeeded: int = Field(description="Succeeded realisations of the campaign")
    included: int = Field(description="Realisations the aggregates include (the ledger)")
    spectra_realizations: int = Field(description="Realisations whose spectra are in the means")
    map_realizations: int = Field(description="Realisations whose maps are in the mean map")
    ready: bool = Field(description="Some aggregate exists")
    generation: int = Field(description="Increases with each update of the aggregates")
    updated_at: str | None = None
    bins: EllBins | None = None
    mask: MaskInfo | None = None
    spectra: dict[SpectrumName, SpectrumStats] | None = None
    noise_bias: NoiseBias | None = None
    transfer_function: TransferFunction | None = None
    bandpowers: BandpowerProducts | None = None
    downloads: ProductDownloads
    warnings: list[str] = Field(default_factory=list)


class RealizationSpectra(ProductsModel):
    """One realisation's binned pseudo-spectra as its result stores them (K^2)."""

    campaign_id: int
    realization: int
    bins: EllBins
    spectra: dict[SpectrumName, list[float]]
    w2: float
    fsky: float
    model: dict[SpectrumName, list[float]] | None = None


DATA_SPECTRUM_DEFINITION = (
    "C_b = (C_b^data - N_b) / F_b: the data map's decoupled bandpowers (I monopole and dipole removed over the "
    "mask) less the noise campaign's N_b, over the transfer campaign's F_b; it estimates the sky's B_b^2 C_b "
    "(beam not deconvolved). error = sqrt(diag covariance) / |F_b| with the covariance campaign's signal+noise "
    "covariance; the Monte Carlo errors of N_b and F_b are given apart and not included"
)


TRANSFER_MATRIX_DEFINITION = (
    "T_b[X, Y] with X (out) and Y (in) in (EE, EB, BB): <C_b^X> = sum_Y T_b[X, Y] m_b^Y, m_b^Y the input C_l "
    "with its beam through the bandpower windows. Column EE: the pure-E campaign's mean (EE, EB, BB) over its model "
    "EE; column BB: the pure-B campaign's over its model BB; T_b[BB, EE] is the E -> B leakage. Column EB: the "
    "identity, assumed (no campaign has an EB input and the model's EB is 0), error 0. error: Monte Carlo error "
    "of each element (sample covariance of the realisations over n and the model squared)"
)
MATRIX_SPECTRUM_DEFINITION = (
    "(EE, EB, BB)_b = T_b^-1 (C_b^data - N_b) with the E/B transfer matrix T_b of a pure-E and a pure-B campaign; "
    "TT, TE, TB = (C_b^data - N_b) / F_b with F_b of the pure-E campaign (which keeps T and E). It estimates the "
    "sky's B_b^2 C_b (beam not deconvolved) whatever its BB, where F_b folds the E -> B leakage into a factor right "
    "for the simulations' BB only. error: the covariance campaign's errors through T_b^-1; error_matrix: the "
    "matrix's own Monte Carlo error through T_b^-1 (first order; add in quadrature)"
)


class TransferMatrixCampaigns(ProductsModel):
    pure_e: int = Field(description="Signal-only campaign with sky.polarization = E-only")
    pure_b: int = Field(description="Signal-only campaign with sky.polarization = B-only")


class TransferMatrix(ProductsModel):
    """The E/B transfer matrix of a pure-E and a pure-B campaign (``GET /api/v1/transfer-matrix``)."""

    definition: str = TRANSFER_MATRIX_DEFINITION
    campaigns: TransferMatrixCampaigns
    n_e: int = Field(description="Realisations of the pure-E campaign behind the matrix")
    n_b: int = Field(description="Realisations of the pure-B campaign behind the matrix")
    generations: list[int] = Field(description="Generations of the two campaigns' aggregates (pure E, pure B)")
    scan_key: str
    mask_sha256: str
    purify_b: bool
    bins: BandpowerBins
    spectra: list[str] = Field(description="Order of the rows (out) and columns (in): EE, EB, BB")
    matrix: list[list[list[float | None]]] = Field(description="Per bin, out (rows) by in (columns); null where the model is not positive")
    error: list[list[list[float | None]]] = Field(description="Monte Carlo errors, laid out as matrix; null below 2 realisations")


class SpectrumCampaigns(ProductsModel):
    transfer: int | None = Field(None, description="Signal-only campaign giving F_b (or the pair below)")
    transfer_e: int | None = Field(None, description="Pure-E campaign of the transfer matrix (and F_b of TT, TE)")
    transfer_b: int | None = Field(None, description="Pure-B campaign of the transfer matrix")
    noise: int = Field(description="Noise-only campaign giving N_b")
    covariance: int | None = Field(None, description="Signal+noise campaign giving the bandpower covariance")


class DataSpectrum(ProductsModel):
    """Unbiased bandpowers of a user's map with Monte Carlo errors (``POST /api/v1/spectrum``), K^2."""

    definition: str = DATA_SPECTRUM_DEFINITION
    campaigns: SpectrumCampaigns
    scan_key: str
    mask_sha256: str
    purify_b: bool
    nside: int
    bins: BandpowerBins
    cb: dict[SpectrumName, list[float | None]] = Field(description="Unbiased bandpowers; null where F_b is undefined")
    error: dict[SpectrumName, list[float | None]] | None = Field(
        None, description="1-sigma error of each bandpower from the covariance campaign; null without one"
    )
    data_cb: dict[SpectrumName, list[float]] = Field(description="The map's decoupled bandpowers before debiasing")
    noise_bias: dict[SpectrumName, BandpowerEstimate]
    transfer_function: dict[SpectrumName, BandpowerEstimate]
    model: dict[SpectrumName, list[float]] | None = Field(
        None, description="The transfer campaign's input C_l with its beam through the windows: what cb estimates "
        "for a sky like the simulations'"
    )
    correction: Literal["transfer-function", "transfer-matrix"] = Field(
        "transfer-function", description="How cb was corrected: per-bin F_b, or the E/B transfer matrix for EE EB BB"
    )
    transfer_matrix: TransferMatrix | None = Field(None, description="The matrix used (correction transfer-matrix)")
    error_matrix: dict[SpectrumName, list[float | None]] | None = Field(
        None, description="The transfer matrix's own Monte Carlo error on cb (EE, EB, BB; 0 elsewhere); apart from error"
    )
    covariance_n: int | None = Field(None, description="Realisations behind the covariance")
    hartlap: float | None = Field(None, description="Hartlap factor of the whole covariance; null when n <= p + 2")
    monopole_k: float = Field(description="Monopole of the map's I over the mask (K), removed")
    dipole_k: list[float] = Field(description="Dipole vector of the map's I over the mask (K), removed")
