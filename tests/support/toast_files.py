"""TOAST focal-plane files built at test time with TOAST itself (``toast`` is in the test extras).

``write_focal_plane`` saves a :class:`toast.instrument.Focalplane` exactly as a collaboration would
(``Focalplane.save_hdf5`` into a ``toast.io.H5File``); the tests then read it back through
``campaignlib.instrument`` and compare the map-maker's pointing and noise with TOAST's own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import astropy.units as u
import numpy as np
import pytest
from astropy.table import Column, QTable

from campaignlib.instrument import ScheduleFileError, resolve_files
from schemas.spec import CampaignSpec

NET_UNIT = u.K * u.s**0.5


def detector_quat(offset_x_deg: float, offset_y_deg: float, pol_angle_deg: float) -> np.ndarray:
    """TOAST quaternion [x, y, z, w] of a detector at an offset, turned by a polarisation angle (toast.qarray)."""
    import toast.qarray as qa

    xaxis, yaxis, zaxis = np.eye(3)
    q = qa.rotation(zaxis, np.radians(pol_angle_deg))
    q = qa.mult(qa.rotation(xaxis, -np.radians(offset_y_deg)), q)
    return np.asarray(qa.mult(qa.rotation(yaxis, np.radians(offset_x_deg)), q), dtype=np.float64)


def focal_plane_table(
    names: Sequence[str],
    quats: np.ndarray,
    *,
    net: Sequence[float],
    fknee: Sequence[float] | float = 0.0,
    fmin: Sequence[float] | float = 1e-4,
    alpha: Sequence[float] | float = 1.0,
    pol_angle_deg: Sequence[float] | None = None,
    wafer: Sequence[str] | None = None,
    band: Sequence[str] | None = None,
) -> QTable:
    """The detector table TOAST keeps (its column names and units)."""
    n = len(names)

    def each(value: Sequence[float] | float) -> np.ndarray:
        return np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()

    table = QTable(
        [
            Column(name="name", data=list(names)),
            Column(name="quat", data=np.asarray(quats, dtype=np.float64)),
            Column(name="pol_angle", data=each(pol_angle_deg if pol_angle_deg is not None else 0.0) * u.deg),
            Column(name="psd_net", data=each(net) * NET_UNIT),
            Column(name="psd_fknee", data=each(fknee) * u.Hz),
            Column(name="psd_fmin", data=each(fmin) * u.Hz),
            Column(name="psd_alpha", data=each(alpha)),
            Column(name="fwhm", data=np.full(n, 30.0) * u.arcmin),
        ]
    )
    if wafer is not None:
        table["wafer"] = list(wafer)
    if band is not None:
        table["band"] = list(band)
    return table


def write_focal_plane(path: Path, table: QTable, sample_rate_hz: float = 5.0) -> str:
    """Save ``table`` with ``toast.instrument.Focalplane.save_hdf5``; return the file's sha256."""
    import toast.io
    from toast.instrument import Focalplane

    focal_plane = Focalplane(detector_data=table, sample_rate=sample_rate_hz * u.Hz)
    with toast.io.H5File(str(path), "w", comm=None) as handle:
        focal_plane.save_hdf5(handle.handle, comm=None)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hexagon_focal_plane(path: Path, n_pix: int, sample_rate_hz: float = 5.0, width_deg: float = 5.0) -> str:
    """TOAST's simulated hexagonal focal plane (2 detectors per pixel), saved as a collaboration would."""
    import toast.io
    from toast.instrument_sim import fake_hexagon_focalplane

    focal_plane = fake_hexagon_focalplane(
        n_pix=n_pix,
        sample_rate=sample_rate_hz * u.Hz,
        width=width_deg * u.deg,
        fwhm=10 * u.arcmin,
        psd_net=100e-6 * NET_UNIT,
        psd_fknee=0.05 * u.Hz,
        psd_fmin=1e-4 * u.Hz,
        psd_alpha=1.0,
    )
    with toast.io.H5File(str(path), "w", comm=None) as handle:
        focal_plane.save_hdf5(handle.handle, comm=None)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_ground_schedule(path: Path, scans: Sequence[dict], site_lat_deg: float, site_lon_deg: float) -> str:
    """Write a TOAST 3 ground schedule (``GroundSchedule.write`` to ``.ecsv``); return its sha256.

    ``scans``: dicts of ``name``, ``start``/``stop`` (timezone-aware datetimes), ``az_min``, ``az_max``, ``el`` (deg).
    """
    from toast.schedule import GroundScan, GroundSchedule

    schedule = GroundSchedule(
        scans=[
            GroundScan(
                name=scan["name"],
                start=scan["start"],
                stop=scan["stop"],
                az_min=scan["az_min"] * u.deg,
                az_max=scan["az_max"] * u.deg,
                el=scan["el"] * u.deg,
                scan_indx=index,
            )
            for index, scan in enumerate(scans)
        ],
        site_name="site",
        telescope_name="telescope",
        site_lat=site_lat_deg * u.deg,
        site_lon=site_lon_deg * u.deg,
        site_alt=5_200 * u.m,
    )
    schedule.write(str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_satellite_schedule(path: Path, scans: Sequence[dict]) -> str:
    """Write a TOAST 3 satellite schedule (``SatelliteSchedule.write`` to ``.ecsv``); return its sha256.

    ``scans``: dicts of ``name``, ``start``/``stop`` (timezone-aware datetimes), ``prec_period`` and
    ``spin_period`` (minutes).
    """
    from toast.schedule import SatelliteScan, SatelliteSchedule

    schedule = SatelliteSchedule(
        scans=[
            SatelliteScan(
                name=scan["name"],
                start=scan["start"],
                stop=scan["stop"],
                prec_period=scan["prec_period"] * u.minute,
                spin_period=scan["spin_period"] * u.minute,
            )
            for scan in scans
        ],
        site_name="space",
        telescope_name="satellite",
    )
    schedule.write(str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_schedule_refused(path: Path, spec_for: Callable[[str, str], CampaignSpec], column: str) -> None:
    """Resolving a spec of the schedule at ``path`` (``spec_for(file name, sha256)``, the file beside the
    instrument root) is refused naming the file and ``column`` ("": the file as a whole)."""
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ScheduleFileError) as caught:
        resolve_files(spec_for(path.name, sha), path.parent)
    assert caught.value.column == column and f"'{path.name}'" in str(caught.value)
    if column:
        assert f"column {column!r}" in str(caught.value)
