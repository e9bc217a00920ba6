"""The direction of the Earth from the solar-system barycentre: a satellite's precession axis.

Here, below both, because the map-maker points the satellite with it and the service lists each scheduled
scan's anti-Sun direction with it.

TOAST's ``SpaceSite`` places a satellite at the Earth's barycentric position (astropy's built-in ERFA
ephemeris, ``get_body_barycentric``, no download) and points the precession axis away from the
barycentre, the anti-Sun direction to within the Sun's wobble about the barycentre. The position is
computed at nodes at most ``NODE_SPACING_S`` apart and interpolated, as TOAST does; the Earth turns
1.2e-4 rad about the Sun between nodes, so the interpolation is good to well under 1e-9 rad.
"""

from __future__ import annotations

import numpy as np

NODE_SPACING_S = 600.0

# ICRS (J2000 equatorial) to ecliptic: the rotation matrix TOAST's qarray.equ2ecl is built from.
EQUATORIAL_TO_ECLIPTIC = np.array(
    [
        [1.0, 0.0, 0.0],
        [0.0, 0.917482062069182, 0.397777155931914],
        [0.0, -0.397777155931914, 0.917482062069182],
    ]
)


def anti_sun_direction(unix_s: np.ndarray) -> np.ndarray:
    """Unit vectors [n, 3] (ecliptic frame) from the barycentre to the Earth at the UTC times ``unix_s`` [n] (s)."""
    import astropy.units as u
    from astropy.coordinates import get_body_barycentric
    from astropy.time import Time

    times = np.asarray(unix_s, dtype=np.float64)
    if len(times) == 0:
        return np.zeros((0, 3))
    span = float(times[-1] - times[0])
    nodes = np.linspace(times[0], times[-1], num=max(2, 1 + int(np.ceil(span / NODE_SPACING_S))))
    position = get_body_barycentric("earth", Time(nodes, format="unix")).xyz.to_value(u.km)  # [3, n_nodes]
    position = np.stack([np.interp(times, nodes, position[axis]) for axis in range(3)], axis=-1)
    position = position @ EQUATORIAL_TO_ECLIPTIC.T
    unit: np.ndarray = position / np.linalg.norm(position, axis=1, keepdims=True)
    return unit
