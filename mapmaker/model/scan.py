"""From the spec's scan and focal plane to the pointing kernels' arguments.

Pointing is generated on the fly, one time chunk at a time, by the rank that
owns the chunk; nothing here holds the pointing of the whole observation.
"""
from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from campaignlib.ephemeris import anti_sun_direction
from mapmaker.kernels import boresight, implementation, pointing
from mapmaker.kernels.implementation import Kernels
from mapmaker.model.decomposition import ChunkLayout
from schemas.spec import CampaignSpec, FocalPlane, GroundScan, GroundScheduleScan, SatelliteScan, SatelliteScheduleScan

DEG = math.pi / 180.0


def sample_times(layout: ChunkLayout, time_chunk: int, sample_rate_hz: float) -> np.ndarray:
    """Times (s from the start) of the samples of one time chunk, [n]."""
    first, n = layout.time_chunk_bounds(time_chunk)
    return (first + np.arange(n, dtype=np.float64)) / sample_rate_hz


def boresight_quaternions(
    scan: SatelliteScan | GroundScan, times_s: np.ndarray, kernels: ModuleType = boresight
) -> np.ndarray:
    """Boresight orientation [n, 4] at ``times_s`` [n] (s) for either scan family (``kernels``: its module)."""
    if isinstance(scan, SatelliteScan):
        return kernels.satellite(
            times_s,
            start_longitude=scan.start_longitude_deg * DEG,
            drift_rate=scan.drift_deg_per_day * DEG / 86_400.0,
            precession_rate=2.0 * math.pi / scan.precession_period_s,
            precession_angle=scan.precession_angle_deg * DEG,
            spin_rate=2.0 * math.pi / scan.spin_period_s,
            spin_angle=scan.spin_angle_deg * DEG,
        )
    if isinstance(scan, GroundScan):
        return kernels.ground(
            times_s,
            site_latitude=scan.site_latitude_deg * DEG,
            elevation=scan.elevation_deg * DEG,
            azimuth_min=scan.azimuth_min_deg * DEG,
            azimuth_max=scan.azimuth_max_deg * DEG,
            azimuth_rate=scan.azimuth_rate_deg_s * DEG,
            start_lst=scan.start_lst_deg * DEG,
            earth_rotation=scan.earth_rotation,
        )
    raise TypeError(f"unknown scan kind {type(scan).__name__}")


def scheduled_boresight(
    schedule: GroundScheduleScan, time_chunk: int, times_s: np.ndarray, kernels: ModuleType = boresight
) -> np.ndarray:
    """Boresight [n, 4] of one time chunk of a schedule: the constant-elevation scan that holds the chunk.

    ``times_s`` [n] are on the observation's time axis (scans back to back, gaps removed); the scan's
    own clock starts at its ``offset_s``, its sky at its ``start_lst_deg``.
    """
    first = 0
    for scan in schedule.scans:
        if time_chunk < first + scan.chunks:
            return kernels.ground(
                np.asarray(times_s, dtype=np.float64) - scan.offset_s,
                site_latitude=schedule.site_latitude_deg * DEG,
                elevation=scan.elevation_deg * DEG,
                azimuth_min=scan.azimuth_min_deg * DEG,
                azimuth_max=scan.azimuth_max_deg * DEG,
                azimuth_rate=schedule.azimuth_rate_deg_s * DEG,
                start_lst=scan.start_lst_deg * DEG,
                earth_rotation=schedule.earth_rotation,
            )
        first += scan.chunks
    raise IndexError(f"time chunk {time_chunk} is beyond the schedule's {first} chunks")


def satellite_scheduled_boresight(schedule: SatelliteScheduleScan, time_chunk: int, times_s: np.ndarray) -> np.ndarray:
    """Boresight [n, 4] (ecliptic) of one time chunk of a satellite schedule: the scan that holds the chunk.

    ``times_s`` [n] are on the observation's time axis (scans back to back, gaps removed). Within its scan a
    sample at ``t`` from the scan's first sample is at UTC ``start_unix_s + t`` (where the precession axis
    is) and at ``phase_offset_s + t`` on TOAST's running clock of the spin and precession phases. Always the
    numpy kernel: the ephemeris, not the quaternion algebra, is what costs here.
    """
    first = 0
    for scan in schedule.scans:
        if time_chunk < first + scan.chunks:
            local = np.asarray(times_s, dtype=np.float64) - scan.offset_s
            return boresight.satellite_precessing(
                scan.phase_offset_s + local,
                anti_sun_direction(scan.start_unix_s + local),
                precession_period_s=scan.precession_period_s,
                precession_angle=schedule.precession_angle_deg * DEG,
                spin_period_s=scan.spin_period_s,
                spin_angle=schedule.spin_angle_deg * DEG,
            )
        first += scan.chunks
    raise IndexError(f"time chunk {time_chunk} is beyond the schedule's {first} chunks")


def detector_quaternions(focal_plane: FocalPlane) -> np.ndarray:
    """Fixed rotation of every detector in the boresight frame, [n_detectors, 4], scalar first.

    A detector with a quaternion (from a TOAST focal-plane file) is taken as it is: TOAST's order
    [x, y, z, w] becomes [w, x, y, z]. Both frames have the line of sight along +z and the polarisation
    direction along +x, so TOAST's rotation needs no other change. Others are built from their offsets.
    """
    rows = []
    for d in focal_plane.detector_rows:
        if d.quat is not None:
            x, y, z, w = d.quat
            rows.append(np.array([w, x, y, z], dtype=np.float64))
        else:
            rows.append(pointing.detector_quaternion(d.offset_x_deg * DEG, d.offset_y_deg * DEG, d.pol_angle_deg * DEG))
    return np.array(rows)


class ChunkPointing:
    """Pixels and weights of one (time chunk, detector), reusing the boresight of the last time chunk.

    Chunks are visited in time-major order, so consecutive calls mostly share
    a time chunk and its boresight is computed once for all its detectors.
    ``kernels``: the implementation from :func:`mapmaker.kernels.implementation.get` (default: its
    default, the fast kernels; the numpy reference gives the same pixels).
    """

    def __init__(self, spec: CampaignSpec, layout: ChunkLayout, kernels: Kernels | None = None):
        self._kernels = kernels if kernels is not None else implementation.get()
        self._scan = spec.scan
        self._rate = spec.focal_plane.sample_rate_hz
        self._nside = spec.pixelization.nside
        self._layout = layout
        self._detectors = detector_quaternions(spec.focal_plane)
        self._cached_time_chunk = -1
        self._cached_boresight = np.zeros((0, 4))

    def boresight(self, time_chunk: int) -> np.ndarray:
        if time_chunk != self._cached_time_chunk:
            times = sample_times(self._layout, time_chunk, self._rate)
            if isinstance(self._scan, GroundScheduleScan):
                self._cached_boresight = scheduled_boresight(self._scan, time_chunk, times, self._kernels.boresight)
            elif isinstance(self._scan, SatelliteScheduleScan):
                self._cached_boresight = satellite_scheduled_boresight(self._scan, time_chunk, times)
            else:
                self._cached_boresight = boresight_quaternions(self._scan, times, self._kernels.boresight)
            self._cached_time_chunk = time_chunk
        return self._cached_boresight

    def __call__(self, time_chunk: int, detector: int) -> tuple[np.ndarray, np.ndarray]:
        """``pixels [n] int64`` (RING) and ``weights [n, 3]`` of one chunk."""
        return self._kernels.pointing.detector_pointing(self.boresight(time_chunk), self._detectors[detector], self._nside)
