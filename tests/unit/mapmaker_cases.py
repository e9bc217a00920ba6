"""Small campaign specs for the map-maker tests (a few 10^5 samples, nside 8-32)."""
from __future__ import annotations

import copy
from typing import Any

from schemas.spec import CampaignSpec

# Four detectors at one spot with polarisation angles 0, 45, 90, 135 degrees: every
# sample time then gives the 3x3 block diag(4, 2, 2), which makes sigma^2 / hits the
# exact variance of I and keeps every observed pixel well conditioned.
COLOCATED_QUAD = [
    {"name": f"D{angle}", "offset_x_deg": 0.5, "offset_y_deg": 0.0, "pol_angle_deg": float(angle)}
    for angle in (0, 45, 90, 135)
]

# Two pairs at different spots, as in the bundled examples.
TWO_PAIRS = [
    {"name": "A0", "offset_x_deg": 1.0, "offset_y_deg": 0.0, "pol_angle_deg": 0.0},
    {"name": "B0", "offset_x_deg": 1.0, "offset_y_deg": 0.0, "pol_angle_deg": 90.0},
    {"name": "A1", "offset_x_deg": -1.0, "offset_y_deg": 0.0, "pol_angle_deg": 45.0},
    {"name": "B1", "offset_x_deg": -1.0, "offset_y_deg": 0.0, "pol_angle_deg": 135.0},
]

BASE: dict[str, Any] = {
    "name": "mapmaker test",
    "kind": "signal+noise",
    "realizations": 4,
    "seed": 20111112,
    "scan": {
        "kind": "satellite",
        "duration_s": 7200.0,
        "chunk_s": 900.0,
        "spin_period_s": 60.0,
        "spin_angle_deg": 50.0,
        "precession_period_s": 600.0,
        "precession_angle_deg": 45.0,
        "drift_deg_per_day": 2880.0,
    },
    "focal_plane": {"sample_rate_hz": 5.0, "detectors": TWO_PAIRS},
    "pixelization": {"nside": 16},
    "sky": {"kind": "cmb", "seed": 1, "fwhm_arcmin": 300.0},
    "noise": {"net_k_sqrt_s": 100e-6, "f_knee_hz": 0.0, "alpha": 1.0, "f_min_hz": 1e-4},
    "solver": {"tol": 1e-8, "max_iter": 300, "rcond_min": 0.01},
    "resources": {"ranks": 1},
}


def make_spec(changes: dict[str, Any] | None = None, **top: Any) -> CampaignSpec:
    """BASE with ``changes`` given as dotted paths ({"noise.f_knee_hz": 1.0}) and top-level keywords."""
    data = copy.deepcopy(BASE)
    data.update(copy.deepcopy(top))
    for dotted, value in (changes or {}).items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = copy.deepcopy(value)
    return CampaignSpec.model_validate(data)


def spec_dict(spec: CampaignSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json")
