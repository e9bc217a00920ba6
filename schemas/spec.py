"""The campaign specification: what a user submits and what every part reads.

Units are in the field names: ``_deg`` degrees, ``_arcmin`` arcminutes,
``_s`` seconds, ``_hz`` hertz, ``_k_sqrt_s`` kelvin times square-root second
(noise-equivalent temperature). Angles are converted to radians only inside
``mapmaker``.

Two hashes name what a spec fixes:

* :func:`scan_key` hashes everything that fixes the pointing and the data
  decomposition (scan pattern, focal-plane geometry, sampling, chunking,
  pixelisation). The overlap preprocessing is keyed by it and the rank count.
* :func:`spec_hash` hashes the whole spec, defaults included, so two specs
  that differ only by an omitted default hash the same; the number of
  realisations is left out (a campaign may be extended).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

SCAN_KEY_VERSION = 1
COARSE_KEY_VERSION = 2  # bump with mapmaker.solve.coarsefile.COARSE_FORMAT: an older file must not be named
COUPLING_KEY_VERSION = 1  # bump when mapmaker.model.bandpowers stops reading a format (READABLE_COUPLING_FORMATS)

MAX_REALIZATIONS = 100_000
MAX_RANKS = 65_536
MAX_DETECTORS = 10_000
MAX_NSIDE = 8192

# Printable text without control characters; names are shown in terminals and web pages.
# Bidirectional embeddings, overrides and isolates count too: they make a name read differently
# from what it is ("Trojan Source" spoofing).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_DETECTOR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$")


def _a_number(value: Any) -> Any:
    """Refuse what pydantic's lax mode would turn into a number: ``true`` (1) and ``"16"`` (16)."""
    if isinstance(value, (bool, str)):
        raise PydanticCustomError(
            "number_type",
            "Input should be a number, not {kind} ({value})",
            {"kind": "a boolean" if isinstance(value, bool) else "a string", "value": repr(value)},
        )
    return value


# The spec's numbers: JSON, TOML and YAML numbers only (a whole float such as 16.0 still passes as an Integer).
Float = Annotated[float, BeforeValidator(_a_number)]
Integer = Annotated[int, BeforeValidator(_a_number)]
OptionalFloat = Annotated[float | None, BeforeValidator(_a_number)]  # one Annotated around the union keeps the
OptionalInteger = Annotated[int | None, BeforeValidator(_a_number)]  # Field's bounds in the JSON schema


class StrictModel(BaseModel):
    """Base for every spec model: unknown fields are errors, not silently dropped (``schemas.io`` names a close
    match); numbers are :data:`Float` / :data:`Integer` (numbers, not booleans or numeric strings) and finite
    (an unbounded field such as ``noise.interval_s`` would otherwise take ``inf``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- scan patterns


class SatelliteScan(StrictModel):
    """Spin + precession + drift, as flown by WMAP, Planck, LiteBIRD.

    The anti-Sun direction moves along the ecliptic at ``drift_deg_per_day``;
    the spin axis precesses around it at ``precession_angle_deg`` with period
    ``precession_period_s``; the boresight spins around the spin axis at
    ``spin_angle_deg`` with period ``spin_period_s``. Map frame: ecliptic.
    """

    kind: Literal["satellite"] = "satellite"
    duration_s: Float = Field(86_400.0, gt=0, le=5 * 365.25 * 86_400, description="Length of the observation")
    chunk_s: Float = Field(3_600.0, gt=0, description="Length of one data chunk, the unit of the MPI decomposition")
    spin_period_s: Float = Field(60.0, gt=0, le=86_400, description="Period of the boresight around the spin axis")
    spin_angle_deg: Float = Field(50.0, gt=0, lt=180, description="Boresight angle from the spin axis")
    precession_period_s: Float = Field(
        3_600.0, gt=0, le=365.25 * 86_400, description="Period of the spin axis around the anti-Sun direction"
    )
    precession_angle_deg: Float = Field(45.0, ge=0, lt=180, description="Spin-axis angle from the anti-Sun direction")
    drift_deg_per_day: Float = Field(360.0 / 365.25, ge=0, le=3_600, description="Motion of the anti-Sun direction")
    start_longitude_deg: Float = Field(0.0, ge=-360, le=360, description="Ecliptic longitude of the anti-Sun direction at t=0")

    @model_validator(mode="after")
    def _chunk_fits(self) -> SatelliteScan:
        _check_chunk(self.chunk_s, self.duration_s)
        return self


class GroundScan(StrictModel):
    """Constant-elevation scans: azimuth sweeps back and forth at fixed elevation.

    The sky drifts through the scan as the Earth rotates (``earth_rotation``).
    Map frame: equatorial (RA, Dec) at the start of the observation.
    """

    kind: Literal["ground"] = "ground"
    duration_s: Float = Field(86_400.0, gt=0, le=5 * 365.25 * 86_400, description="Length of the observation")
    chunk_s: Float = Field(3_600.0, gt=0, description="Length of one data chunk, the unit of the MPI decomposition")
    site_latitude_deg: Float = Field(-22.96, ge=-90, le=90, description="Geodetic latitude of the telescope")
    elevation_deg: Float = Field(50.0, gt=0, lt=90, description="Constant elevation of the boresight")
    azimuth_min_deg: Float = Field(-30.0, ge=-360, le=360, description="Start of the azimuth sweep")
    azimuth_max_deg: Float = Field(30.0, ge=-360, le=360, description="End of the azimuth sweep")
    azimuth_rate_deg_s: Float = Field(1.0, gt=0, le=30, description="Scan speed in azimuth")
    earth_rotation: bool = Field(True, description="Let the sky drift through the scan as the Earth turns")
    start_lst_deg: Float = Field(0.0, ge=0, lt=360, description="Local sidereal time at t=0")

    @model_validator(mode="after")
    def _azimuth_range(self) -> GroundScan:
        span = self.azimuth_max_deg - self.azimuth_min_deg
        if span <= 0:
            raise ValueError("azimuth_max_deg must be greater than azimuth_min_deg")
        if span > 360:
            raise ValueError("the azimuth range may span at most 360 degrees")
        _check_chunk(self.chunk_s, self.duration_s)
        return self


def _sha256_hex(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value.lower()):
        raise ValueError("sha256 must be 64 hexadecimal digits")
    return value.lower()


def _schedule_path(value: str) -> str:
    return _check_relative_path(value, (".ecsv",), "the instrument folder", "a TOAST schedule in ECSV (.ecsv)")


# A file's checksum (64 hex digits, kept in lower case) and a schedule's path under the instrument_root.
Sha256 = Annotated[str, AfterValidator(_sha256_hex)]
ScheduleFile = Annotated[str, AfterValidator(_schedule_path)]


class ScheduledScan(StrictModel):
    """One constant-elevation scan of a schedule, as the map-maker observes it (read from the file)."""

    name: str = Field(description="The schedule's patch name")
    offset_s: Float = Field(ge=0, description="Where the scan starts on the observation's time axis (gaps removed)")
    chunks: Integer = Field(ge=1, description="Whole chunks of chunk_s the scan holds (a shorter tail is left out)")
    start_lst_deg: Float = Field(description="Local sidereal time at the scan's start")
    start_unix_s: OptionalFloat = Field(None, description="UTC time of the scan's start (s since 1970)")
    azimuth_min_deg: Float
    azimuth_max_deg: Float
    elevation_deg: Float = Field(gt=0, lt=90)


class GroundScheduleScan(StrictModel):
    """Constant-elevation scans read from a TOAST 3 ground schedule (``GroundSchedule.write`` to ``.ecsv``).

    Each scheduled scan (start and stop time, azimuth range, elevation; the site's latitude and longitude from
    the file) is cut into whole chunks of ``chunk_s``; the time between scans is not observed, and a chunk (so a
    stationary noise interval) never spans two scans. The sky drifts through each scan as the Earth turns, from
    the local sidereal time of the scan's start. Map frame: equatorial (RA, Dec). The file lives under the
    instrument_root, pinned by its sha256, like a focal-plane file.
    """

    kind: Literal["ground-schedule"] = "ground-schedule"
    file: ScheduleFile = Field(description="TOAST ground schedule (.ecsv), relative to the instrument_root")
    sha256: Sha256 = Field(description="SHA-256 of the file (64 hex digits)")
    chunk_s: Float = Field(600.0, gt=0, le=86_400, description="Length of one data chunk; each scan holds whole chunks")
    azimuth_rate_deg_s: Float = Field(1.0, gt=0, le=30, description="Scan speed in azimuth")
    earth_rotation: bool = Field(True, description="Let the sky drift through the scan as the Earth turns")
    first_scans: OptionalInteger = Field(None, ge=1, le=1_000_000, description="Take only the first N scans of the file")
    # The scans read from ``file`` (campaignlib.instrument.resolve_files) and the site's latitude: never input, never dumped.
    _scans: tuple[ScheduledScan, ...] | None = PrivateAttr(None)
    _site_latitude_deg: float | None = PrivateAttr(None)


    @property
    def scans(self) -> tuple[ScheduledScan, ...]:
        if self._scans is None:
            raise ScheduleNotRead(f"the schedule {self.file!r} has not been read (campaignlib.instrument.resolve_files)")
        return self._scans

    @property
    def site_latitude_deg(self) -> float:
        _ = self.scans  # refuses an unread schedule
        assert self._site_latitude_deg is not None
        return self._site_latitude_deg

    @property
    def duration_s(self) -> float:
        """Observed time: the whole chunks of every scan (the schedule must have been read)."""
        return sum(scan.chunks for scan in self.scans) * self.chunk_s


class SatelliteScheduledScan(StrictModel):
    """One scan of a satellite schedule, as the map-maker observes it (read from the file).

    TOAST samples a satellite schedule on one clock from the first scan's start and keeps the spin and
    precession phases running over the scans' samples only (gaps left out); ``phase_offset_s`` is that
    running time at the scan's first sample, ``start_unix_s`` the first sample's UTC time.
    """

    name: str = Field(description="The schedule's scan name")
    offset_s: Float = Field(ge=0, description="Where the scan starts on the observation's time axis (gaps removed)")
    chunks: Integer = Field(ge=1, description="Whole chunks of chunk_s the scan holds (a shorter tail is left out)")
    start_unix_s: Float = Field(description="UTC time of the scan's first sample (s since 1970)")
    phase_offset_s: Float = Field(ge=0, description="TOAST's sample clock (s, gaps left out) at the scan's first sample")
    precession_period_s: Float = Field(gt=0, description="Period of the spin axis around the anti-Sun direction")
    spin_period_s: Float = Field(gt=0, description="Period of the boresight around the spin axis")


class SatelliteScheduleScan(StrictModel):
    """Spin and precession scans read from a TOAST 3 satellite schedule (``SatelliteSchedule.write`` to ``.ecsv``).

    Each scheduled scan (start and stop time, precession and spin periods) is cut into whole chunks of
    ``chunk_s``; the time between scans is not observed, and a chunk (so a stationary noise interval) never
    spans two scans. The boresight follows TOAST's ``SimSatellite``: the precession axis points from the
    solar-system barycentre to the Earth (the anti-Sun direction, as TOAST's ``SpaceSite`` has it) at each
    sample's time, the spin axis turns around it at ``precession_angle_deg``, the boresight around the spin axis
    at ``spin_angle_deg`` (TOAST keeps both angles on the operator, not in the file). Map frame: ecliptic. The
    file lives under the instrument_root, pinned by its sha256, like a focal-plane file.
    """

    kind: Literal["satellite-schedule"] = "satellite-schedule"
    file: ScheduleFile = Field(description="TOAST satellite schedule (.ecsv), relative to the instrument_root")
    sha256: Sha256 = Field(description="SHA-256 of the file (64 hex digits)")
    chunk_s: Float = Field(600.0, gt=0, le=86_400, description="Length of one data chunk; each scan holds whole chunks")
    spin_angle_deg: Float = Field(30.0, gt=0, lt=180, description="Boresight angle from the spin axis (TOAST's spin_angle)")
    precession_angle_deg: Float = Field(
        65.0, ge=0, lt=180, description="Spin-axis angle from the anti-Sun direction (TOAST's prec_angle)"
    )
    first_scans: OptionalInteger = Field(None, ge=1, le=1_000_000, description="Take only the first N scans of the file")
    # The scans read from ``file`` (campaignlib.instrument.resolve_files): never input, never dumped.
    _scans: tuple[SatelliteScheduledScan, ...] | None = PrivateAttr(None)


    @property
    def scans(self) -> tuple[SatelliteScheduledScan, ...]:
        if self._scans is None:
            raise ScheduleNotRead(f"the schedule {self.file!r} has not been read (campaignlib.instrument.resolve_files)")
        return self._scans

    @property
    def duration_s(self) -> float:
        """Observed time: the whole chunks of every scan (the schedule must have been read)."""
        return sum(scan.chunks for scan in self.scans) * self.chunk_s


class ScheduleNotRead(RuntimeError):
    """A program asked for the scans of a schedule before reading the file."""


def _check_chunk(chunk_s: float, duration_s: float) -> None:
    if chunk_s > duration_s:
        raise ValueError("chunk_s must not exceed duration_s")
    if duration_s / chunk_s > 10_000_000:
        raise ValueError("duration_s / chunk_s gives more than 10 million chunks per detector")


ScanSpec = Annotated[SatelliteScan | GroundScan | GroundScheduleScan | SatelliteScheduleScan, Field(discriminator="kind")]


# --------------------------------------------------------------------------- focal plane


class Detector(StrictModel):
    """One detector: its offset from the boresight and its polarisation angle, or its quaternion.

    Detectors read from a TOAST focal-plane file carry ``quat`` and their own noise parameters; inline
    detectors usually give offsets and take the campaign-wide ``noise``.
    """

    name: str = Field(description="Unique within the focal plane; letters, digits and _.:+-")
    offset_x_deg: Float = Field(0.0, ge=-10, le=10, description="Offset from the boresight along the focal-plane x axis")
    offset_y_deg: Float = Field(0.0, ge=-10, le=10, description="Offset from the boresight along the focal-plane y axis")
    pol_angle_deg: Float = Field(0.0, ge=-360, le=360, description="Polarisation angle in the focal plane, from the x axis")
    net_k_sqrt_s: OptionalFloat = Field(None, gt=0, lt=1, description="Override of the noise NET for this detector")
    quat: tuple[Float, Float, Float, Float] | None = Field(
        None,
        description="Rotation of the detector in the boresight frame, TOAST's order [x, y, z, w]; when given it fixes "
        "the pointing and the polarisation direction (the offsets and pol_angle_deg only describe it)",
    )
    f_knee_hz: OptionalFloat = Field(None, ge=0, le=1_000, description="Override of the noise knee frequency")
    alpha: OptionalFloat = Field(None, gt=0, le=5, description="Override of the noise 1/f slope")
    f_min_hz: OptionalFloat = Field(None, gt=0, le=100, description="Override of the noise low-frequency flattening")

    @field_validator("name")
    @classmethod
    def _name_is_safe(cls, value: str) -> str:
        if not _DETECTOR_NAME.match(value):
            raise ValueError("detector names are 1-64 characters of letters, digits and _.:+-, starting with a letter or digit")
        return value

    @field_validator("quat")
    @classmethod
    def _unit_quaternion(cls, value: tuple[float, float, float, float] | None) -> tuple[float, float, float, float] | None:
        if value is not None and abs(math.sqrt(sum(c * c for c in value)) - 1.0) > 1e-6:
            raise ValueError("quat must be a unit quaternion (norm 1 within 1e-6)")
        return value


class DetectorSelection(StrictModel):
    """Which detectors of a focal-plane file the campaign takes; the conditions combine (all must hold)."""

    names: str | None = Field(None, min_length=1, max_length=200, description="Shell pattern on detector names, e.g. 'D1*-150'")
    wafer: str | None = Field(None, min_length=1, max_length=200, description="Value of the file's 'wafer' (or 'wafer_slot') column")
    band: str | None = Field(None, min_length=1, max_length=200, description="Value of the file's 'band' column")
    first: OptionalInteger = Field(None, ge=1, le=MAX_DETECTORS, description="Keep the first N detectors (in file order) that match")


class FocalPlane(StrictModel):
    """The detectors: typed inline (``detectors``) or read from a TOAST focal-plane HDF5 file (``file``).

    A file is named relative to the instrument folder (the service's and each site's ``instrument_root``) and
    pinned by its ``sha256``: the file's checksum and the selection enter the scan key.
    """

    sample_rate_hz: Float = Field(20.0, gt=0, le=10_000, description="Samples per second of every detector")
    detectors: list[Detector] | None = Field(
        None, min_length=1, max_length=MAX_DETECTORS, description="The detectors, one table each (see below); or give file"
    )
    file: str | None = Field(
        None, description="TOAST focal-plane HDF5 file (Focalplane.save_hdf5), relative to the instrument_root"
    )
    sha256: Sha256 | None = Field(None, description="SHA-256 of the file (64 hex digits); required with file")
    select: DetectorSelection = Field(default_factory=DetectorSelection, description="Part of the file's focal plane to take")
    # The detectors read from ``file`` (campaignlib.instrument.resolve_focal_plane): never input, never dumped.
    _from_file: tuple[Detector, ...] | None = PrivateAttr(None)
    _file_detectors: int | None = PrivateAttr(None)  # rows in the file before the selection

    @field_validator("detectors")
    @classmethod
    def _unique_names(cls, detectors: list[Detector] | None) -> list[Detector] | None:
        seen: set[str] = set()
        for detector in detectors or []:
            if detector.name in seen:
                raise ValueError(f"detector name {detector.name!r} appears more than once")
            seen.add(detector.name)
        return detectors

    @field_validator("file")
    @classmethod
    def _file_is_safe(cls, value: str | None) -> str | None:
        return None if value is None else _check_relative_path(value, (".h5", ".hdf5"), "the instrument folder", "an HDF5 file (.h5 or .hdf5)")

    @model_validator(mode="after")
    def _one_source(self) -> FocalPlane:
        if (self.detectors is None) == (self.file is None):
            raise ValueError("give either detectors (inline) or file (a TOAST focal-plane file), not both")
        if self.file is not None and self.sha256 is None:
            raise ValueError("a focal-plane file needs its sha256 (sha256sum FILE)")
        if self.file is None and (self.sha256 is not None or self.select != DetectorSelection()):
            raise ValueError("sha256 and select go with file")
        return self

    @property
    def detector_rows(self) -> list[Detector]:
        """The campaign's detectors: the inline ones, or those read from the file (which must have been read)."""
        if self.detectors is not None:
            return self.detectors
        if self._from_file is None:
            raise FocalPlaneNotRead(f"the focal plane of {self.file!r} has not been read (campaignlib.instrument.resolve_focal_plane)")
        return list(self._from_file)


class FocalPlaneNotRead(RuntimeError):
    """A program asked for the detectors of a file-based focal plane before reading the file."""


# --------------------------------------------------------------------------- pixelisation, sky


class Pixelization(StrictModel):
    """HEALPix pixelisation in RING ordering."""

    nside: Integer = Field(64, ge=1, le=MAX_NSIDE, description="HEALPix resolution, a power of two: 12 nside^2 pixels")

    @field_validator("nside")
    @classmethod
    def _power_of_two(cls, nside: int) -> int:
        if nside & (nside - 1):
            raise ValueError(f"nside must be a power of two (1, 2, 4, ... {MAX_NSIDE}), got {nside}")
        return nside

    @property
    def npix(self) -> int:
        return 12 * self.nside * self.nside


def _check_relative_path(
    value: str,
    suffixes: tuple[str, ...] = (".fits", ".fit", ".fits.gz"),
    folder: str = "the sky-map folder",
    kind: str = "a FITS file (.fits, .fit or .fits.gz)",
) -> str:
    """Refuse paths that could leave the folder they are resolved in, or that name another kind of file."""
    if not value or len(value) > 255:
        raise ValueError("path must be 1-255 characters")
    if CONTROL_CHARACTERS.search(value) or "\\" in value:
        raise ValueError("path must not contain control characters or backslashes")
    path = PurePosixPath(value)
    if path.is_absolute() or value.startswith("~"):
        raise ValueError(f"path must be relative to {folder}, not absolute")
    if any(part in ("..", ".") for part in path.parts):
        raise ValueError("path must not contain '.' or '..' components")
    if not value.lower().endswith(suffixes):
        raise ValueError(f"path must name {kind}")
    return value


class PowerLawCls(StrictModel):
    """``C_l = amplitude_k2 (ell / ell_pivot)^index`` for ell >= 2 (0 below): the kept polarisation's input spectrum."""

    amplitude_k2: Float = Field(gt=0, le=1e-6, description="C_l at ell_pivot, K^2 (not D_l)")
    ell_pivot: Float = Field(80.0, gt=0, le=10_000, description="Multipole where C_l equals amplitude_k2")
    index: Float = Field(-2.0, ge=-6, le=4, description="Power-law index of C_l")


SkyPolarization = Literal["both", "E-only", "B-only"]


class CmbSky(StrictModel):
    """A Gaussian CMB realisation drawn (synfast) from the bundled fiducial C_l.

    ``polarization`` keeps the E and B modes ("both"), or only one of them: "E-only" draws B = 0 (T, E and
    TE as usual), "B-only" draws E = 0 (T and B; TE = 0). A pure-E and a pure-B signal-only campaign of the
    same scan, rank count, mask settings (``solver.rcond_min``, ``products``) and binning, that is with the
    same coupling key (:func:`coupling_key`), give the E/B transfer matrix of the pipeline. ``power_law``
    replaces the kept polarisation's spectrum (EE for E-only, BB for B-only) by a power law: the matrix
    treats the power inside a bin as a scale factor of the input's, so a shape close to the data's (or a
    smooth one) is the better input where the fiducial spectrum is steep or has a zero.
    """

    kind: Literal["cmb"] = "cmb"
    cls: Literal["fiducial"] = Field("fiducial", description="C_l to draw from: the bundled fiducial spectrum")
    seed: Integer = Field(0, ge=0, le=2**63 - 1, description="Seed of the sky realisation")
    fwhm_arcmin: Float = Field(0.0, ge=0, le=10_800, description="Gaussian beam full width at half maximum")
    lmax: OptionalInteger = Field(None, ge=2, le=6000, description="Default: 3 nside - 1, at most 6000")
    polarization: SkyPolarization = Field(
        "both", description="Polarisation modes drawn: both, E-only (B = 0) or B-only (E = 0); for transfer matrices"
    )
    power_law: PowerLawCls | None = Field(
        None, description="E-only / B-only: the kept spectrum (EE or BB) as a power law instead of the fiducial one"
    )

    @model_validator(mode="after")
    def _power_law_needs_one_polarisation(self) -> CmbSky:
        if self.power_law is not None and self.polarization == "both":
            raise PydanticCustomError(
                "power_law_needs_one_polarization",
                'sky.power_law replaces the kept polarisation\'s spectrum: set sky.polarization = "E-only" or '
                '"B-only" with it',
            )
        return self


class MapSky(StrictModel):
    """A user-supplied IQU FITS map, relative to the sky-map folder of the site."""

    kind: Literal["map"] = "map"
    path: str = Field(description="IQU FITS map (K), relative to the site's sky_root; no '..', not absolute")
    fwhm_arcmin: Float = Field(0.0, ge=0, le=10_800, description="Extra Gaussian smoothing applied to the map")

    @field_validator("path")
    @classmethod
    def _path_is_safe(cls, value: str) -> str:
        return _check_relative_path(value)


class NoSky(StrictModel):
    """No sky signal (the TOD is noise only)."""

    kind: Literal["none"] = "none"


SkySpec = Annotated[CmbSky | MapSky | NoSky, Field(discriminator="kind")]


# --------------------------------------------------------------------------- noise, solver, resources


class NoiseSpec(StrictModel):
    """Piecewise-stationary noise with PSD  sigma^2 (1 + (f_knee / max(f, f_min))^alpha).

    sigma^2 = NET^2 * sample_rate is the white-noise variance per sample.
    ``enabled = False`` (or the string "off") simulates no noise; the solve
    still weights samples by the white level.
    """

    enabled: bool = Field(True, description="Simulate noise; false (or noise = \"off\") gives noiseless TOD")
    net_k_sqrt_s: Float = Field(50e-6, gt=0, lt=1, description="White-noise level of every detector without an override")
    f_knee_hz: Float = Field(0.0, ge=0, le=1_000, description="Knee frequency; 0 gives white noise")
    alpha: Float = Field(1.0, gt=0, le=5, description="Slope of the 1/f part")
    f_min_hz: Float = Field(1e-4, gt=0, le=100, description="Below this frequency the PSD is flat")
    interval_s: OptionalFloat = Field(
        None, gt=0, description="Length of a stationary interval; default: the scan's chunk_s. Chunks are cut into intervals."
    )

    @model_validator(mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip().lower() == "off":
                return {"enabled": False}
            raise ValueError('noise must be an object or the string "off"')
        return value

    @model_validator(mode="after")
    def _f_min_below_knee(self) -> NoiseSpec:
        if self.f_knee_hz > 0 and self.f_min_hz >= self.f_knee_hz:
            raise ValueError("f_min_hz must be below f_knee_hz")
        return self


# The pixel reductions of mapmaker.parallel.reduction (docs/explanation/reductions.md); one list for the
# spec, the result, the calibration and the model.
ReductionStrategy = Literal[
    "allreduce", "alltoallv", "butterfly", "hybrid", "neighbor", "pairwise", "alltoallv-overlap", "neighbor-overlap"
]
STRATEGY_NAMES: tuple[str, ...] = get_args(ReductionStrategy)
Reduction = Literal["auto", ReductionStrategy]
Preconditioner = Literal["auto", "block-diagonal", "two-level", "two-level-additive"]
NoiseFilter = Literal["exact", "finite"]
PointingMode = Literal["cached", "recomputed"]


class SolverSpec(StrictModel):
    tol: Float = Field(1e-6, gt=0, lt=1, description="Relative residual ||r|| / ||b|| at which PCG stops")
    max_iter: Integer = Field(200, ge=1, le=10_000, description="PCG stops here even if not converged")
    rcond_min: Float = Field(1e-2, ge=0, lt=1, description="Pixels whose 3x3 hit matrix has a smaller rcond are cut")
    reduction: Reduction = Field(
        "auto", description="Pixel reduction of each PCG iteration; auto picks by the alpha-beta model"
    )
    allreduce_buffer_pixels: Integer = Field(
        1 << 16, ge=1, le=1 << 28, description="Pixels per buffered Allreduce call (the paper's n_b)"
    )
    preconditioner: Preconditioner = Field(
        "auto",
        description="auto: two-level when its coarse operator is shared through realize --coarse-cache (the file "
        "exists, or the campaign has more than one realisation) and its A Z fits 2 GiB per rank, else "
        "block-diagonal (no set-up to pay back); once the file exists, one realisation solves with each and the "
        "rest with the faster (timings beside the file); block-diagonal: the 3x3 white-noise blocks; two-level: those plus a coarse-space "
        "correction on coarse_nside pixels, A-DEF2 (fewest iterations; holds A Z, 12 bytes per pixel and coarse "
        "column, read every iteration); two-level-additive: the blocks plus Z E^-1 Z^T (a few more iterations at "
        "the block-diagonal one's cost, holds E only). Both coarse forms set up with one operator application "
        "per coarse column, shared by a campaign's realisations through realize --coarse-cache",
    )
    coarse_nside: Integer = Field(
        4, ge=1, le=64, description="HEALPix resolution of the two-level preconditioner's coarse space, a power of two "
        "(capped at the map's nside): 3 x 12 coarse_nside^2 columns; higher costs more set-up for fewer iterations"
    )
    coarse_stokes: Literal["IQU", "I"] = Field(
        "IQU", description="Stokes parameters of the coarse space's columns: IQU (3 per coarse pixel) or I (1: the "
        "temperature pattern of the 1/f stripes; a third of the columns, A Z and set-up, and at nside 512 as few "
        "iterations; the satellite example at nside 64 needs IQU's polarised modes for its fewest)"
    )
    noise_filter: NoiseFilter = Field(
        "exact", description="N^-1 per stationary interval: exact (full Fourier transform) or finite (a kernel of "
        "finite correlation length by overlap-save, within noise_filter_tolerance)"
    )
    noise_filter_tolerance: Float = Field(
        1e-3, gt=0, le=0.1, description="finite filter: largest relative error of its spectrum against 1/PSD; the "
        "map's noise grows by at most a factor sqrt((1 + t) / (1 - t))"
    )

    pointing: PointingMode = Field(
        "cached", description="cached: each sample's local pixel (int32) and IQU weights (3 x float32, relative "
        "rounding 6e-8) held for the solve, 16 bytes per sample; recomputed: the weights computed again from the "
        "boresight, a chunk at a time, at every application of P and P^T (as MADmap did), 4 bytes per sample held "
        "(the local pixel) for more time per iteration. Maps agree to the solver's tolerance"
    )

    @field_validator("coarse_nside")
    @classmethod
    def _coarse_power_of_two(cls, nside: int) -> int:
        if nside & (nside - 1):
            raise ValueError(f"coarse_nside must be a power of two (1, 2, 4, ... 64), got {nside}")
        return nside


class ResourceSpec(StrictModel):
    ranks: Integer = Field(2, ge=1, le=MAX_RANKS, description="MPI ranks per realisation")
    threads_per_rank: Integer = Field(1, ge=1, le=256, description="Threads of each rank (numba, FFTs, BLAS)")
    ranks_per_node: OptionalInteger = Field(None, ge=1, le=1024, description="Default: all ranks on one node")
    walltime_s: Float = Field(3_600.0, ge=1, le=7 * 86_400, description="Wall-time limit of one attempt")
    memory_mb_per_rank: OptionalInteger = Field(
        None, ge=16, le=4_194_304, description="Memory to ask a batch scheduler for, per rank"
    )

    @property
    def nodes(self) -> int:
        per_node = self.ranks_per_node or self.ranks
        return math.ceil(self.ranks / per_node)


class ProductSpec(StrictModel):
    """Monte Carlo products: the analysis mask, the pseudo-spectra and the decoupled (MASTER) bandpowers."""

    ell_bin_width: Integer = Field(
        8, ge=1, le=1_000, description="Multipoles per bin of the pseudo-spectra and of the bandpowers"
    )
    lmax: OptionalInteger = Field(
        None, ge=2, le=24_576,
        description="Last multipole of the pseudo-spectra (default: 2 nside); the bandpowers always run to 3 nside - 2",
    )
    apodization_deg: Float = Field(
        5.0, ge=0, le=90, description="Apodisation scale of the hit/rcond mask (pspy's C2 taper, degrees)"
    )
    min_hits: Integer = Field(3, ge=1, description="Pixels with fewer hits are masked")
    purify_b: bool = Field(
        True, description="Pure-B (and pure-E) bandpowers on a masked sky (Smith 2006); false: the standard estimator"
    )
    map_precision: Literal["float64", "float32"] = Field(
        "float64",
        description=(
            "Precision of each realisation's I/Q/U map file: float32 halves it and keeps about 7 significant "
            "digits (far below a map's noise); the service's mean and variance maps still accumulate in float64"
        ),
    )


CampaignKind = Literal["signal+noise", "noise-only", "signal-only"]


# --------------------------------------------------------------------------- campaign


class CampaignSpec(StrictModel):
    """Everything that defines a Monte Carlo campaign."""

    name: str = Field(min_length=1, max_length=200, description="Shown in listings and the dashboard")
    description: str = Field("", max_length=4_000, description="Free text for people")
    kind: CampaignKind = Field(
        "signal+noise", description="What the TOD holds; noise-only gives the noise bias, signal-only the transfer function"
    )
    realizations: Integer = Field(1, ge=1, le=MAX_REALIZATIONS, description="Monte Carlo realisations to run")
    seed: Integer = Field(0, ge=0, le=2**63 - 1, description="Campaign seed: keys every random stream")
    priority: Integer = Field(0, ge=-1_000, le=1_000, description="Higher runs first")
    max_attempts: Integer = Field(3, ge=1, le=50, description="Attempts of a realisation before it counts as failed")
    hold_after_failures: Integer = Field(
        3,
        ge=0,
        le=1_000,
        description=(
            "Fail fast: hold the campaign (no more dispatching) when this many attempts in a row, of two "
            "realisations or more, fail with the same failure class and error; `retry` releases it. 0: never hold"
        ),
    )
    scan: ScanSpec = Field(default_factory=SatelliteScan)
    focal_plane: FocalPlane
    pixelization: Pixelization = Field(default_factory=Pixelization)
    sky: SkySpec = Field(default_factory=CmbSky)
    noise: NoiseSpec = Field(default_factory=NoiseSpec)
    solver: SolverSpec = Field(default_factory=SolverSpec)
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    products: ProductSpec = Field(default_factory=ProductSpec)

    @field_validator("name", "description")
    @classmethod
    def _no_control_chars(cls, value: str) -> str:
        if CONTROL_CHARACTERS.search(value.replace("\n", "").replace("\t", "")):
            raise ValueError("must not contain control characters")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CampaignSpec:
        if self.kind == "noise-only" and not self.noise.enabled:
            raise ValueError("a noise-only campaign needs noise.enabled = true")
        if self.kind == "signal-only" and isinstance(self.sky, NoSky):
            raise ValueError("a signal-only campaign needs a sky (sky.kind 'cmb' or 'map')")
        if isinstance(self.sky, CmbSky) and self.sky.polarization != "both" and self.kind != "signal-only":
            raise ValueError(
                f"sky.polarization = {self.sky.polarization!r} is for transfer-matrix campaigns: kind must be "
                f"'signal-only', not {self.kind!r} (pair it with a campaign of the other polarisation and the same "
                "scan, ranks, solver.rcond_min and products settings)"
            )
        samples_per_chunk = self.scan.chunk_s * self.focal_plane.sample_rate_hz
        if samples_per_chunk < 2:
            raise ValueError("scan.chunk_s * focal_plane.sample_rate_hz must give at least 2 samples per chunk")
        if self.noise.interval_s is not None and self.noise.interval_s * self.focal_plane.sample_rate_hz < 2:
            raise ValueError("noise.interval_s * focal_plane.sample_rate_hz must give at least 2 samples per interval")
        return self

    # ----------------------------------------------------------------- derived quantities

    @property
    def samples_per_detector(self) -> int:
        return round(self.scan.duration_s * self.focal_plane.sample_rate_hz)

    @property
    def total_samples(self) -> int:
        return self.samples_per_detector * len(self.focal_plane.detector_rows)

    @property
    def simulates_signal(self) -> bool:
        return self.kind != "noise-only" and not isinstance(self.sky, NoSky)

    @property
    def simulates_noise(self) -> bool:
        return self.kind != "signal-only" and self.noise.enabled


# --------------------------------------------------------------------------- hashes


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal data give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _sha256(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def pointing_fingerprint(spec: CampaignSpec) -> dict[str, Any]:
    """The part of a spec that fixes the pointing and the decomposition into chunks."""
    plane = spec.focal_plane
    focal_plane: dict[str, Any]
    if plane.file is not None:
        # The file's content (its checksum) and the selection fix the detectors, wherever the file sits.
        focal_plane = {
            "sample_rate_hz": plane.sample_rate_hz,
            "file_sha256": plane.sha256,
            "select": plane.select.model_dump(mode="json"),
        }
    else:
        focal_plane = {"sample_rate_hz": plane.sample_rate_hz, "detectors": []}
        for detector in plane.model_dump(mode="json")["detectors"]:
            for noise_field in ("net_k_sqrt_s", "f_knee_hz", "alpha", "f_min_hz"):
                detector.pop(noise_field, None)  # noise, not pointing
            if detector["quat"] is None:
                del detector["quat"]  # keeps the keys of offset-only focal planes as they were
            focal_plane["detectors"].append(detector)
    scan = spec.scan.model_dump(mode="json")
    if isinstance(spec.scan, (GroundScheduleScan, SatelliteScheduleScan)):
        del scan["file"]  # the content (sha256) fixes the scans, wherever the file sits
    return {
        "version": SCAN_KEY_VERSION,
        "scan": scan,
        "focal_plane": focal_plane,
        "nside": spec.pixelization.nside,
    }


def scan_key(spec: CampaignSpec) -> str:
    """Stable hash of everything that fixes the pointing (64 hex characters)."""
    return _sha256(pointing_fingerprint(spec))


# Fields added to the spec after campaigns were stored, by (section, name): at their default they are left out of
# the spec hash, so a spec written before they existed hashes as it did (its idempotent resubmission and its
# results' hash check keep working). A new field with a default belongs here.
FIELDS_ADDED_LATER: dict[tuple[str, str], Any] = {
    ("sky", "polarization"): "both",
    ("sky", "power_law"): None,
    ("products", "map_precision"): "float64",
    ("solver", "pointing"): "cached",
    ("solver", "coarse_stokes"): "IQU",
}


def spec_hash(spec: CampaignSpec) -> str:
    """Stable hash of the whole spec, defaults included, but for the number of realisations (64 hex characters).

    The count is left out because a campaign may be extended with more realisations: those made before and
    after the extension are of one spec, into one set of aggregates. Every realisation's own inputs (the
    seeds are keyed by its index) are in the hash.
    """
    data = spec.model_dump(mode="json")
    data.pop("realizations", None)
    for (section, name), default in FIELDS_ADDED_LATER.items():
        fields = data.get(section) or {}
        if name in fields and fields[name] == default:
            del fields[name]
    return _sha256(data)


def coupling_key(spec: CampaignSpec) -> str:
    """Stable hash (64 hex characters) of everything the bandpowers' mode coupling depends on.

    The analysis mask is the hit map's pixels with ``products.min_hits`` hits that the rcond cut of the
    geometric 3x3 hit matrix keeps, apodised over ``products.apodization_deg``: the pointing (the scan
    key), ``solver.rcond_min`` and those products settings; the coupling adds the binning and the
    estimator. The rank count is in the key as it is in the overlap plan's: the rcond of a pixel is
    summed in another order on another number of ranks, and a pixel on the threshold could fall on the
    other side, giving another mask (which the map-maker refuses, never mixes). Campaigns of one scan
    pattern, rank count and these settings (a transfer, a noise and a signal+noise campaign) share one
    coupling file at a site.
    """
    products = spec.products
    return _sha256(
        {
            "version": COUPLING_KEY_VERSION,
            "scan_key": scan_key(spec),
            "ranks": spec.resources.ranks,
            "rcond_min": spec.solver.rcond_min,
            "min_hits": products.min_hits,
            "apodization_deg": products.apodization_deg,
            "ell_bin_width": products.ell_bin_width,
            "purify_b": products.purify_b,
        }
    )


def coarse_key(spec: CampaignSpec) -> str:
    """Stable hash (64 hex characters) of everything the two-level preconditioner's coarse operator depends on.

    ``E = Z^T A Z`` and ``A Z`` (:mod:`mapmaker.solve.coarse`) are made of the pointing (the scan key),
    the rcond cut (``solver.rcond_min``), the noise model that weights the solve (whether noise is
    simulated, the noise section and every detector's noise overrides: the PSDs), the N^-1 filter
    (``solver.noise_filter`` and its tolerance), ``solver.coarse_nside`` and ``coarse_stokes``, and the rank count (which rank
    holds which rows, and the order of the sums). Never of the seed, the sky or the realisation: every
    realisation of a campaign, and every campaign of that scan and noise, share one coarse file at a site.
    """
    plane = spec.focal_plane
    if plane.file is not None:
        detectors: Any = {"file_sha256": plane.sha256, "select": plane.select.model_dump(mode="json")}
    else:
        detectors = [
            {name: detector.get(name) for name in ("name", "net_k_sqrt_s", "f_knee_hz", "alpha", "f_min_hz")}
            for detector in plane.model_dump(mode="json")["detectors"]
        ]
    solver = spec.solver
    return _sha256(
        {
            "version": COARSE_KEY_VERSION,
            "scan_key": scan_key(spec),
            "ranks": spec.resources.ranks,
            "rcond_min": solver.rcond_min,
            "simulates_noise": spec.simulates_noise,
            "noise": spec.noise.model_dump(mode="json"),
            "detector_noise": detectors,
            "noise_filter": solver.noise_filter,
            "noise_filter_tolerance": solver.noise_filter_tolerance,
            "coarse_nside": solver.coarse_nside,
            "preconditioner": solver.preconditioner,  # A-DEF2's file holds A Z, the additive form's E only
            # Named only when not the default, so the keys of IQU coarse files (and the files) stay as they were.
            **({"coarse_stokes": solver.coarse_stokes} if solver.coarse_stokes != "IQU" else {}),
        }
    )
