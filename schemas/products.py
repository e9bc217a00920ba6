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


class ProductDownloads(ProductsModel):
    """Paths (under the API prefix) of the downloads that exist now; add ``?format=fits|npz|json``."""

    spectra: str | None = None
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
