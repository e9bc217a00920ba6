"""Focal planes from TOAST files: read, check and select the detectors of a ``Focalplane.save_hdf5`` file.

TOAST 3 writes a focal plane as an astropy table in the HDF5 dataset ``focalplane`` (astropy's own
HDF5 table format, with the column units in its metadata). This module reads it with astropy, so units
are converted by astropy, not by hand, and turns each selected row into a :class:`schemas.spec.Detector`:

==============  ===========================  ============================================
TOAST column    unit in the file             detector field
==============  ===========================  ============================================
``name``        --                           ``name``
``quat``        -- ([x, y, z, w])            ``quat`` (and the offsets derived from it)
``pol_angle``   angle (or ``psi_pol``)       ``pol_angle_deg`` (described; the quat rules)
``psd_net``     K s^1/2                      ``net_k_sqrt_s``
``psd_fknee``   Hz                           ``f_knee_hz``
``psd_fmin``    Hz                           ``f_min_hz``
``psd_alpha``   --                           ``alpha``
==============  ===========================  ============================================

Columns the campaign does not use (``fwhm``, ``bandcenter``, ``uid``, a collaboration's own ...) are
left alone. A problem is a :class:`FocalPlaneFileError` naming the file and the column; the service
answers it with a 422 at submit, the map-maker refuses to run with it.

Both the service (to check a spec at submit) and the map-maker (to run it) read the file, so the reader
lives here, below both. The file is found under an *instrument root*, a folder the deployment declares
(``MAPCAMPAIGN_INSTRUMENT_ROOT`` for the service, ``instrument_root`` in a site file for its workers),
the way a ``sky.kind = "map"`` path is found under a site's ``sky_root``; its ``sha256`` in the spec pins
the content, so a site whose copy differs refuses to run instead of mapping another instrument.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.files import sha256_file
from schemas.spec import (
    MAX_DETECTORS,
    CampaignSpec,
    Detector,
    DetectorSelection,
    FocalPlane,
    GroundScheduleScan,
    SatelliteScheduledScan,
    SatelliteScheduleScan,
    ScheduledScan,
)

DATASET = "focalplane"
QUATERNION_COLUMN = "quat"
NOISE_COLUMNS = {  # TOAST column -> (Detector field, astropy unit string)
    "psd_net": ("net_k_sqrt_s", "K s(1/2)"),
    "psd_fknee": ("f_knee_hz", "Hz"),
    "psd_fmin": ("f_min_hz", "Hz"),
    "psd_alpha": ("alpha", ""),
}
POL_ANGLE_COLUMNS = ("pol_angle", "psi_pol")
WAFER_COLUMNS = ("wafer", "wafer_slot")
BAND_COLUMN = "band"


class FocalPlaneFileError(ValueError):
    """A focal-plane file that cannot be used: ``file`` (as the spec names it), ``column`` (or ""), why."""

    what = "focal-plane file"

    def __init__(self, file: str, column: str, reason: str):
        where = f"column {column!r} of " if column else ""
        super().__init__(f"{where}{self.what} {file!r}: {reason}")
        self.file = file
        self.column = column
        self.reason = reason


@dataclass(frozen=True)
class FocalPlaneTable:
    """The selected detectors of a file, and what the file said about itself."""

    detectors: tuple[Detector, ...]
    file_detectors: int  # rows in the file before the selection
    file_sample_rate_hz: float | None  # the table's ``sample_rate`` metadata, if any


def resolve_instrument_path(instrument_root: str | Path | None, relative: str) -> Path:
    """The file ``relative`` under ``instrument_root``, refusing anything that leaves it (``..``, symlinks)."""
    if instrument_root is None:
        raise FocalPlaneFileError(relative, "", "no instrument_root is configured here to find it in")
    root = Path(instrument_root).resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise FocalPlaneFileError(relative, "", "resolves outside the instrument_root")
    if not path.is_file():
        raise FocalPlaneFileError(relative, "", f"no such file under the instrument_root {str(root)!r}")
    return path


def _column_values(table: Any, column: str, unit: str, file: str) -> Any:
    """The float64 values [n] of ``column`` in ``unit`` (astropy converts); a missing or odd column is an error."""
    import astropy.units as u
    import numpy as np

    if column not in table.colnames:
        raise FocalPlaneFileError(file, column, "the column is missing")
    values = table[column]
    try:
        if isinstance(values, u.Quantity):
            array = values.to_value(u.Unit(unit)) if unit else values.to_value(u.dimensionless_unscaled)
        else:
            array = np.asarray(values, dtype=np.float64)
    except (u.UnitConversionError, u.UnitsError, TypeError, ValueError) as error:
        raise FocalPlaneFileError(file, column, f"cannot be read as {unit or 'a number'}: {error}") from None
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 1:
        raise FocalPlaneFileError(file, column, f"must hold one number per detector, has shape {array.shape}")
    return array


def _text_column(table: Any, column: str) -> list[str]:
    """A text column as str (HDF5 keeps fixed-width bytes)."""
    return [value.decode() if isinstance(value, bytes) else str(value) for value in table[column]]


def read_focal_plane_file(path: Path, *, file: str, selection: DetectorSelection) -> FocalPlaneTable:
    """Read, check and select the detectors of a TOAST focal-plane file.

    ``path``: where the file is; ``file``: its name in the spec (for messages). Every selected detector must
    have a finite unit quaternion and noise parameters (``psd_net`` > 0, ``psd_fknee`` >= 0, ``psd_fmin`` > 0,
    ``psd_alpha`` > 0, and ``psd_fmin < psd_fknee`` when the knee is not 0).
    """
    import h5py
    import numpy as np
    from astropy.table import QTable

    try:
        with h5py.File(path, "r") as handle:
            if DATASET not in handle:
                raise FocalPlaneFileError(file, "", f"has no {DATASET!r} dataset (write it with toast.instrument.Focalplane.save_hdf5)")
        table = QTable.read(path, path=DATASET, format="hdf5")
    except FocalPlaneFileError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as error:  # h5py and astropy on a damaged file
        raise FocalPlaneFileError(file, "", f"is not a readable HDF5 focal-plane table ({type(error).__name__}: {error})") from None

    for column in ("name", QUATERNION_COLUMN):
        if column not in table.colnames:
            raise FocalPlaneFileError(file, column, "the column is missing")
    names = _text_column(table, "name")
    quats = np.asarray(table[QUATERNION_COLUMN], dtype=np.float64)
    if quats.ndim != 2 or quats.shape[1] != 4:
        raise FocalPlaneFileError(file, QUATERNION_COLUMN, f"must hold 4 numbers [x, y, z, w] per detector, has shape {quats.shape}")

    keep = np.ones(len(table), dtype=bool)
    if selection.names is not None:
        keep &= np.array([fnmatch.fnmatchcase(name, selection.names) for name in names], dtype=bool)
    if selection.wafer is not None:
        wafer_column = next((c for c in WAFER_COLUMNS if c in table.colnames), None)
        if wafer_column is None:
            raise FocalPlaneFileError(file, WAFER_COLUMNS[0], "select.wafer needs this column (or 'wafer_slot'); it is missing")
        keep &= np.array([value == selection.wafer for value in _text_column(table, wafer_column)], dtype=bool)
    if selection.band is not None:
        if BAND_COLUMN not in table.colnames:
            raise FocalPlaneFileError(file, BAND_COLUMN, "select.band needs this column; it is missing")
        keep &= np.array([value == selection.band for value in _text_column(table, BAND_COLUMN)], dtype=bool)
    rows = np.flatnonzero(keep)
    if selection.first is not None:
        rows = rows[: selection.first]
    if len(rows) == 0:
        raise FocalPlaneFileError(file, "", f"the selection {selection.model_dump(exclude_none=True)} keeps no detector")
    if len(rows) > MAX_DETECTORS:
        raise FocalPlaneFileError(file, "", f"the selection keeps {len(rows)} detectors, more than {MAX_DETECTORS}")

    noise = {field: _column_values(table, column, unit, file) for column, (field, unit) in NOISE_COLUMNS.items()}
    pol_column = next((c for c in POL_ANGLE_COLUMNS if c in table.colnames), None)
    pol_angle = _column_values(table, pol_column, "deg", file) if pol_column else np.zeros(len(table))

    detectors = []
    for row in rows.tolist():
        name = names[row]
        q = quats[row]
        if not np.all(np.isfinite(q)) or abs(np.linalg.norm(q) - 1.0) > 1e-6:
            raise FocalPlaneFileError(file, QUATERNION_COLUMN, f"detector {name!r}: {q.tolist()} is not a unit quaternion")
        values = {field: float(noise[field][row]) for field in noise}
        for column, (field, _unit) in NOISE_COLUMNS.items():
            if not math.isfinite(values[field]):
                raise FocalPlaneFileError(file, column, f"detector {name!r} has no value ({values[field]})")
        if values["f_knee_hz"] > 0 and values["f_min_hz"] >= values["f_knee_hz"]:
            raise FocalPlaneFileError(file, "psd_fmin", f"detector {name!r}: psd_fmin must be below psd_fknee")
        try:
            detector = Detector(
                name=name,
                pol_angle_deg=float(np.remainder(pol_angle[row] + 360.0, 720.0) - 360.0),
                quat=(float(q[0]), float(q[1]), float(q[2]), float(q[3])),
                **values,
            )
        except ValueError as error:  # pydantic's ValidationError: a value out of the spec's range
            column = _column_of(error)
            raise FocalPlaneFileError(file, column, f"detector {name!r}: {_first_message(error)}") from None
        # The offsets only describe the quaternion (plots, the overlap model); a wide focal plane may reach
        # beyond the +-10 degrees an inline offset may take, so they are set without that bound.
        offset_x, offset_y = quaternion_offsets_deg(q)
        detectors.append(detector.model_copy(update={"offset_x_deg": offset_x, "offset_y_deg": offset_y}))
    seen: set[str] = set()
    for detector in detectors:
        if detector.name in seen:
            raise FocalPlaneFileError(file, "name", f"detector name {detector.name!r} appears more than once")
        seen.add(detector.name)

    rate = table.meta.get("sample_rate")
    rate_hz = None
    if rate is not None:
        import astropy.units as u

        rate_hz = float(rate.to_value(u.Hz)) if isinstance(rate, u.Quantity) else float(rate)
    return FocalPlaneTable(detectors=tuple(detectors), file_detectors=len(table), file_sample_rate_hz=rate_hz)


_FIELD_COLUMNS = {
    "name": "name",
    "offset_x_deg": "quat",
    "offset_y_deg": "quat",
    "quat": "quat",
    "pol_angle_deg": "pol_angle",
    **{field: column for column, (field, _unit) in NOISE_COLUMNS.items()},
}


def _column_of(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        for item in errors():
            if item.get("loc"):
                return _FIELD_COLUMNS.get(str(item["loc"][0]), str(item["loc"][0]))
    return ""


def _first_message(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if callable(errors):
        for item in errors():
            return str(item.get("msg", error))
    return str(error)


def quaternion_offsets_deg(q_xyzw: Any) -> tuple[float, float]:
    """The offsets (degrees) of the line of sight of a TOAST detector quaternion [x, y, z, w].

    The line of sight is the quaternion's rotation of +z, ``(sin ox cos oy, sin oy, cos ox cos oy)`` in the
    offsets of :func:`mapmaker.kernels.pointing.detector_quaternion`.
    """
    x, y, z, w = (float(c) for c in q_xyzw)
    vx = 2.0 * (x * z + w * y)
    vy = 2.0 * (y * z - w * x)
    vz = 1.0 - 2.0 * (x * x + y * y)
    return math.degrees(math.atan2(vx, vz)), math.degrees(math.asin(max(-1.0, min(1.0, vy))))


def quaternion_pol_angle_deg(q_xyzw: Any) -> float:
    """The polarisation angle (degrees) of a TOAST detector quaternion [x, y, z, w]: the direction its +x axis
    takes in the focal plane, from the boresight frame's +x towards +y (exact on the boresight, and to second
    order in the offset elsewhere)."""
    x, y, z, w = (float(c) for c in q_xyzw)
    return math.degrees(math.atan2(2.0 * (x * y + w * z), 1.0 - 2.0 * (y * y + z * z)))


def read_focal_plane(plane: FocalPlane, instrument_root: str | Path | None) -> FocalPlaneTable:
    """Find, check the checksum of, and read the file of a file-based focal plane."""
    if plane.file is None:
        raise ValueError("the focal plane is inline; there is no file to read")
    path = resolve_instrument_path(instrument_root, plane.file)
    digest = sha256_file(path)
    if digest != plane.sha256:
        raise FocalPlaneFileError(plane.file, "", f"its sha256 is {digest}, the spec says {plane.sha256}")
    return read_focal_plane_file(path, file=plane.file, selection=plane.select)


def resolve_focal_plane(spec: CampaignSpec, instrument_root: str | Path | None) -> CampaignSpec:
    """The spec with its file-based focal plane read (``spec.focal_plane.detector_rows`` then works).

    An inline focal plane is returned as it is. The spec itself, and so its hashes, do not change.
    """
    plane = spec.focal_plane
    if plane.file is not None and plane._from_file is None:
        table = read_focal_plane(plane, instrument_root)
        plane._from_file = table.detectors
        plane._file_detectors = table.file_detectors
    return spec


# --------------------------------------------------------------------------- ground schedules

SCHEDULE_COLUMNS = ("start_time", "stop_time", "name", "azmin", "azmax", "el")


class ScheduleFileError(FocalPlaneFileError):
    """A schedule file that cannot be used: ``file``, ``column`` (or ""), why (caught with the focal plane's)."""

    what = "schedule file"


def local_sidereal_time_deg(unix_s: float, longitude_deg: float) -> float:
    """Local mean sidereal time (degrees, [0, 360)) at a UTC instant, taking UT1 = UTC.

    GMST = Earth rotation angle + the IAU 2006 precession polynomial (Capitaine et al. 2003, the first
    two terms); the 0.9 s at most between UT1 and UTC turn the sky by at most 14 arcsec. Written out
    because astropy's ``Time.sidereal_time`` needs UT1 from IERS tables it would download.
    """
    days = unix_s / 86_400.0 + 2_440_587.5 - 2_451_545.0  # since J2000.0
    era = 360.0 * (0.7790572732640 + 1.00273781191135448 * days)
    centuries = days / 36_525.0
    gmst = era + (0.014506 + 4612.156534 * centuries) / 3600.0
    return float((gmst + longitude_deg) % 360.0)


def _read_schedule_table(path: Path, *, file: str, columns: tuple[str, ...]) -> Any:
    """A TOAST ECSV schedule as astropy reads it, with ``columns`` present; errors name ``file`` and the column."""
    from astropy.io import ascii as astropy_ascii

    try:
        table = astropy_ascii.read(path, format="ecsv", guess=False)
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise ScheduleFileError(file, "", f"is not a TOAST ECSV schedule ({type(error).__name__}: {error})") from None
    for column in columns:
        if column not in table.colnames:
            raise ScheduleFileError(file, column, "the column is missing")
    return table


def read_ground_schedule(
    path: Path, *, file: str, chunk_s: float, first_scans: int | None
) -> tuple[float, tuple[ScheduledScan, ...]]:
    """The site latitude (degrees) and the scans of a TOAST 3 ground schedule in ECSV (astropy reads it).

    Each scan keeps its whole chunks of ``chunk_s``; a scan shorter than one chunk is refused (it would
    hold no data), as are a stop before a start, scans out of time order and an elevation outside (0, 90).
    """
    from datetime import datetime

    import astropy.units as u

    table = _read_schedule_table(path, file=file, columns=SCHEDULE_COLUMNS)
    site: dict[str, float] = {}
    for key in ("site_lat", "site_lon"):
        value = table.meta.get(key)
        if value is None:
            raise ScheduleFileError(file, key, "the site's coordinate is missing from the header")
        site[key] = float(u.Quantity(value, u.deg).to_value(u.deg))

    def degrees(column: str) -> Any:
        values = table[column]
        unit = getattr(values, "unit", None)
        return u.Quantity(values, unit or u.deg).to_value(u.deg)

    azmin, azmax, elevation = degrees("azmin"), degrees("azmax"), degrees("el")
    rows = range(len(table)) if first_scans is None else range(min(first_scans, len(table)))
    scans = []
    offset = 0.0
    previous_stop = -math.inf
    for row in rows:
        name = str(table["name"][row])
        try:
            start = datetime.fromisoformat(str(table["start_time"][row])).timestamp()
            stop = datetime.fromisoformat(str(table["stop_time"][row])).timestamp()
        except ValueError as error:
            raise ScheduleFileError(file, "start_time", f"scan {row} ({name!r}): {error}") from None
        if stop <= start or start < previous_stop:
            raise ScheduleFileError(file, "stop_time", f"scan {row} ({name!r}) ends before it starts or overlaps the one before")
        chunks = int((stop - start) // chunk_s)
        if chunks < 1:
            raise ScheduleFileError(file, "stop_time", f"scan {row} ({name!r}) is shorter than one chunk ({chunk_s:g} s)")
        try:
            scan = ScheduledScan(
                name=name,
                offset_s=offset,
                chunks=chunks,
                start_lst_deg=local_sidereal_time_deg(start, site["site_lon"]),
                start_unix_s=start,
                azimuth_min_deg=float(azmin[row]),
                azimuth_max_deg=float(azmax[row]),
                elevation_deg=float(elevation[row]),
            )
        except ValueError as error:
            raise ScheduleFileError(file, "el", f"scan {row} ({name!r}): {_first_message(error)}") from None
        if scan.azimuth_max_deg <= scan.azimuth_min_deg:
            raise ScheduleFileError(file, "azmax", f"scan {row} ({name!r}): azmax must be greater than azmin")
        scans.append(scan)
        offset += chunks * chunk_s
        previous_stop = stop
    if not scans:
        raise ScheduleFileError(file, "", "holds no scan")
    return site["site_lat"], tuple(scans)


# --------------------------------------------------------------------------- satellite schedules

SATELLITE_SCHEDULE_COLUMNS = ("name", "start", "stop", "prec_period", "spin_period")


def read_satellite_schedule(
    path: Path, *, file: str, chunk_s: float, sample_rate_hz: float, first_scans: int | None
) -> tuple[SatelliteScheduledScan, ...]:
    """The scans of a TOAST 3 satellite schedule in ECSV (``SatelliteSchedule.write``; astropy reads it).

    Each scan keeps its whole chunks of ``chunk_s``. The first sample of a scan and the running sample clock
    of the spin and precession phases are TOAST's (``toast.ops.SimSatellite`` at ``sample_rate_hz``): samples
    on one grid from the first scan's start, each scan starting at the first grid point at or after its
    start time, the clock counting each earlier scan's ``1 + int(rate (stop - first sample))`` samples. A scan
    shorter than one chunk, a stop before a start, scans out of time order, and periods that are not positive
    are refused.
    """
    from datetime import datetime

    import astropy.units as u

    table = _read_schedule_table(path, file=file, columns=SATELLITE_SCHEDULE_COLUMNS)

    def seconds(column: str) -> Any:
        values = table[column]
        unit = getattr(values, "unit", None)
        try:
            return u.Quantity(values, unit or u.minute).to_value(u.s)  # TOAST writes minutes
        except (u.UnitConversionError, u.UnitsError, TypeError, ValueError) as error:
            raise ScheduleFileError(file, column, f"cannot be read as a time: {error}") from None

    precession, spin = seconds("prec_period"), seconds("spin_period")
    if len(table) == 0:
        raise ScheduleFileError(file, "", "holds no scan")
    times = []
    for row in range(len(table)):
        name = str(table["name"][row])
        try:
            start = datetime.fromisoformat(str(table["start"][row])).timestamp()
        except ValueError as error:
            raise ScheduleFileError(file, "start", f"scan {row} ({name!r}): {error}") from None
        try:
            stop = datetime.fromisoformat(str(table["stop"][row])).timestamp()
        except ValueError as error:
            raise ScheduleFileError(file, "stop", f"scan {row} ({name!r}): {error}") from None
        times.append((name, start, stop))

    increment = 1.0 / sample_rate_hz
    mission_start = times[0][1]
    rows = len(times) if first_scans is None else min(first_scans, len(times))
    scans = []
    offset = 0.0
    sample_clock = 0  # TOAST's sample_offset: samples of the scans before, gaps left out
    previous_stop = -math.inf
    for row in range(rows):
        name, start, stop = times[row]
        if stop <= start or start < previous_stop:
            raise ScheduleFileError(file, "stop", f"scan {row} ({name!r}) ends before it starts or overlaps the one before")
        for column, values in (("prec_period", precession), ("spin_period", spin)):
            if not (math.isfinite(float(values[row])) and float(values[row]) > 0):
                raise ScheduleFileError(file, column, f"scan {row} ({name!r}): must be a positive time, is {float(values[row]):g} s")
        # As SimSatellite places the scan's samples (a start within 1e-3 sample of the grid is on it).
        fractional_first = sample_rate_hz * (start - mission_start)
        first = int(fractional_first)
        if fractional_first - first > 1.0e-3 * increment:
            first += 1
        first_sample_s = first * increment + mission_start
        samples = 1 + int(sample_rate_hz * (stop - first_sample_s))
        chunks = int((stop - first_sample_s) // chunk_s)
        if chunks < 1:
            raise ScheduleFileError(file, "stop", f"scan {row} ({name!r}) is shorter than one chunk ({chunk_s:g} s)")
        scans.append(
            SatelliteScheduledScan(
                name=name,
                offset_s=offset,
                chunks=chunks,
                start_unix_s=first_sample_s,
                phase_offset_s=sample_clock * increment,
                precession_period_s=float(precession[row]),
                spin_period_s=float(spin[row]),
            )
        )
        offset += chunks * chunk_s
        sample_clock += samples
        previous_stop = stop
    return tuple(scans)


def _schedule_path(scan: GroundScheduleScan | SatelliteScheduleScan, instrument_root: str | Path | None) -> Path:
    """The schedule's file under ``instrument_root``, its checksum checked."""
    try:
        path = resolve_instrument_path(instrument_root, scan.file)
    except FocalPlaneFileError as error:
        raise ScheduleFileError(scan.file, "", error.reason) from None
    digest = sha256_file(path)
    if digest != scan.sha256:
        raise ScheduleFileError(scan.file, "", f"its sha256 is {digest}, the spec says {scan.sha256}")
    return path


def resolve_files(spec: CampaignSpec, instrument_root: str | Path | None) -> CampaignSpec:
    """The spec with its focal-plane file and its schedule file read (both under ``instrument_root``)."""
    resolve_focal_plane(spec, instrument_root)
    scan = spec.scan
    if isinstance(scan, GroundScheduleScan) and scan._scans is None:
        path = _schedule_path(scan, instrument_root)
        latitude, scans = read_ground_schedule(path, file=scan.file, chunk_s=scan.chunk_s, first_scans=scan.first_scans)
        scan._site_latitude_deg = latitude
        scan._scans = scans
    if isinstance(scan, SatelliteScheduleScan) and scan._scans is None:
        path = _schedule_path(scan, instrument_root)
        scan._scans = read_satellite_schedule(
            path,
            file=scan.file,
            chunk_s=scan.chunk_s,
            sample_rate_hz=spec.focal_plane.sample_rate_hz,
            first_scans=scan.first_scans,
        )
    return spec


# --------------------------------------------------------------------------- what a campaign read from its files

SUMMARY_DETECTORS = 2_000  # detectors kept for the dashboard's focal-plane plot
SUMMARY_SCANS = 200  # scheduled scans kept for the dashboard's schedule table
SIDEREAL_DAY_S = 86_164.0905


def horizon_to_equatorial_deg(azimuth_deg: float, elevation_deg: float, latitude_deg: float, lst_deg: float) -> tuple[float, float]:
    """RA and Dec (degrees, of date) of a direction at azimuth (from north through east) and elevation, seen
    from ``latitude_deg`` at local sidereal time ``lst_deg`` (no refraction)."""
    azimuth, elevation, latitude = (math.radians(v) for v in (azimuth_deg, elevation_deg, latitude_deg))
    sin_dec = math.sin(latitude) * math.sin(elevation) + math.cos(latitude) * math.cos(elevation) * math.cos(azimuth)
    dec = math.asin(max(-1.0, min(1.0, sin_dec)))
    hour_angle = math.atan2(
        -math.cos(elevation) * math.sin(azimuth),
        math.sin(elevation) * math.cos(latitude) - math.cos(elevation) * math.sin(latitude) * math.cos(azimuth),
    )
    return (lst_deg - math.degrees(hour_angle)) % 360.0, math.degrees(dec)


def _iso(unix_s: float | None) -> str | None:
    from datetime import UTC, datetime

    return None if unix_s is None else datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="seconds")


def instrument_summary(spec: CampaignSpec) -> dict[str, Any] | None:
    """What a spec's files said, small enough to keep with the campaign (JSON; None: no file in the spec).

    ``focal_plane``: the file's detector count and the selected ones (the first :data:`SUMMARY_DETECTORS`
    with their offsets and polarisation angles, degrees), and the range of their NETs. ``schedule``: the scan
    count, the observed time, and the first :data:`SUMMARY_SCANS` scans with their UTC start and observed
    length; a ground scan with its azimuth range, elevation, and the RA/Dec of the middle of its azimuth
    range at the middle of the scan (the field it observes), a satellite scan with its periods and the
    ecliptic longitude of the anti-Sun direction at its middle (the centre of the ring it observes). The spec's
    files must have been read (:func:`resolve_files`).
    """
    summary: dict[str, Any] = {}
    plane = spec.focal_plane
    if plane.file is not None:
        rows = plane.detector_rows
        nets = sorted(d.net_k_sqrt_s for d in rows if d.net_k_sqrt_s is not None)
        summary["focal_plane"] = {
            "file": plane.file,
            "sha256": plane.sha256,
            "file_detectors": plane._file_detectors,
            "detectors": len(rows),
            "net_k_sqrt_s": [nets[0], nets[len(nets) // 2], nets[-1]] if nets else None,  # min, median, max
            "shown": [
                {
                    "name": d.name,
                    "offset_x_deg": round(d.offset_x_deg, 5),
                    "offset_y_deg": round(d.offset_y_deg, 5),
                    "pol_angle_deg": round(quaternion_pol_angle_deg(d.quat) if d.quat else d.pol_angle_deg, 3),
                }
                for d in rows[:SUMMARY_DETECTORS]
            ],
        }
    scan = spec.scan
    if isinstance(scan, GroundScheduleScan):
        shown = []
        for item in scan.scans[:SUMMARY_SCANS]:
            observed = item.chunks * scan.chunk_s
            lst = item.start_lst_deg + 360.0 * (0.5 * observed) / SIDEREAL_DAY_S
            ra, dec = horizon_to_equatorial_deg(
                0.5 * (item.azimuth_min_deg + item.azimuth_max_deg), item.elevation_deg, scan.site_latitude_deg, lst
            )
            shown.append(
                {
                    "name": item.name,
                    "start": _iso(item.start_unix_s),
                    "observed_s": observed,
                    "azimuth_min_deg": item.azimuth_min_deg,
                    "azimuth_max_deg": item.azimuth_max_deg,
                    "elevation_deg": item.elevation_deg,
                    "ra_deg": round(ra, 3),
                    "dec_deg": round(dec, 3),
                }
            )
        summary["schedule"] = {
            "kind": scan.kind,
            "file": scan.file,
            "scans": len(scan.scans),
            "observed_s": scan.duration_s,
            "site_latitude_deg": scan.site_latitude_deg,
            "shown": shown,
        }
    elif isinstance(scan, SatelliteScheduleScan):
        import numpy as np

        from schemas.ephemeris import anti_sun_direction

        listed = scan.scans[:SUMMARY_SCANS]
        middles = np.array([item.start_unix_s + 0.5 * item.chunks * scan.chunk_s for item in listed])
        # Each middle on its own: the directions are interpolated between the times they are asked at.
        axes = np.concatenate([anti_sun_direction(middles[i : i + 1]) for i in range(len(listed))])
        longitudes = np.degrees(np.arctan2(axes[:, 1], axes[:, 0])) % 360.0
        reach = max((math.hypot(d.offset_x_deg, d.offset_y_deg) for d in plane.detector_rows), default=0.0)
        summary["schedule"] = {
            "kind": scan.kind,
            "file": scan.file,
            "scans": len(scan.scans),
            "observed_s": scan.duration_s,
            "coverage": satellite_coverage(scan, focal_plane_reach_deg=reach),
            "shown": [
                {
                    "name": item.name,
                    "start": _iso(item.start_unix_s),
                    "observed_s": item.chunks * scan.chunk_s,
                    "precession_period_s": item.precession_period_s,
                    "spin_period_s": item.spin_period_s,
                    "anti_sun_longitude_deg": round(float(longitude), 3),
                }
                for item, longitude in zip(listed, longitudes, strict=True)
            ],
        }
    return summary or None


COVERAGE_CELL_DEG = 5.0  # the dashboard's sky grid: 72 x 36 cells of ecliptic longitude and latitude


def satellite_coverage(scan: SatelliteScheduleScan, *, focal_plane_reach_deg: float = 0.0) -> dict[str, Any]:
    """The cells of a 5-degree ecliptic grid a satellite schedule's boresight can reach.

    The spin axis turns at the precession angle around the anti-Sun axis and the boresight at the spin angle
    around the spin axis, so over a scan the boresight sweeps the ring between |precession - spin| and
    precession + spin of the anti-Sun direction, taken at each scan's start, middle and end (it moves a degree
    a day). A cell counts when any point of it can be in that ring: its centre within the ring widened by the
    cell's half-diagonal and the focal plane's reach (degrees from the boresight). Returned as the grid's
    ``cell_deg`` and the covered cells' flat indices ``latitude_row * 72 + longitude_column`` (row 0 at
    latitude -90 degrees, column 0 at longitude 0), and the covered fraction of the sky (by solid angle).
    """
    import numpy as np

    from schemas.ephemeris import anti_sun_direction

    n_lon, n_lat = int(360 / COVERAGE_CELL_DEG), int(180 / COVERAGE_CELL_DEG)
    lon = np.radians((np.arange(n_lon) + 0.5) * COVERAGE_CELL_DEG)
    lat = np.radians((np.arange(n_lat) + 0.5) * COVERAGE_CELL_DEG - 90.0)
    cos_lat = np.cos(lat)[:, None]
    centres = np.stack(
        [cos_lat * np.cos(lon)[None, :], cos_lat * np.sin(lon)[None, :], np.broadcast_to(np.sin(lat)[:, None], (n_lat, n_lon))],
        axis=-1,
    ).reshape(-1, 3)  # [n_lat * n_lon, 3]
    # One ephemeris call a scan, for its start, middle and end: its nodes then span the scan, not the gaps.
    axes = [
        anti_sun_direction(item.start_unix_s + np.array([0.0, 0.5, 1.0]) * item.chunks * scan.chunk_s)
        for item in scan.scans
    ]
    margin = math.degrees(math.acos(math.cos(math.radians(COVERAGE_CELL_DEG / 2)) ** 2)) + focal_plane_reach_deg
    inner = max(0.0, abs(scan.precession_angle_deg - scan.spin_angle_deg) - margin)
    outer = scan.precession_angle_deg + scan.spin_angle_deg + margin
    covered = np.zeros(len(centres), dtype=bool)
    for axis in (axis for three in axes for axis in three):  # [n_cells] at a time: small memory for long schedules
        distance = np.degrees(np.arccos(np.clip(centres @ axis, -1.0, 1.0)))
        covered |= (distance >= inner) & (distance <= outer)
    cell_area = (np.sin(lat + np.radians(COVERAGE_CELL_DEG / 2)) - np.sin(lat - np.radians(COVERAGE_CELL_DEG / 2)))
    areas = np.broadcast_to(cell_area[:, None], (n_lat, n_lon)).reshape(-1) * np.radians(COVERAGE_CELL_DEG)
    return {
        "cell_deg": COVERAGE_CELL_DEG,
        "cells": np.flatnonzero(covered).tolist(),
        "sky_fraction": round(float(areas[covered].sum() / (4 * math.pi)), 4),
    }


# --------------------------------------------------------------------------- uploaded files

UPLOADS = "uploads"  # the folder, under the instrument_root, of files uploaded to the service
UPLOAD_SUFFIXES = {"focal-plane": ".h5", "ground-schedule": ".ecsv", "satellite-schedule": ".ecsv"}


def upload_path(sha256: str, kind: str) -> str:
    """Where an uploaded file of ``kind`` is kept, relative to the instrument_root: named by its checksum."""
    return f"{UPLOADS}/{sha256}{UPLOAD_SUFFIXES[kind]}"


def check_instrument_file(path: Path, *, kind: str, file: str) -> int:
    """Check a file as the map-maker will read it; return its detector count (focal plane) or scan count.

    A focal plane is checked over its first :data:`MAX_DETECTORS` rows (a campaign selects at most that
    many); a schedule in full, its scans against a 1 ms chunk (a campaign's ``chunk_s`` is checked at submit).
    Errors name ``file`` and the column, as at submit.
    """
    if kind == "focal-plane":
        table = read_focal_plane_file(path, file=file, selection=DetectorSelection(first=MAX_DETECTORS))
        return table.file_detectors
    if kind == "ground-schedule":
        return len(read_ground_schedule(path, file=file, chunk_s=1e-3, first_scans=None)[1])
    if kind == "satellite-schedule":
        return len(read_satellite_schedule(path, file=file, chunk_s=1e-3, sample_rate_hz=1.0, first_scans=None))
    raise ValueError(f"unknown instrument file kind {kind!r}")
