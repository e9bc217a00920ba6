"""Quick-look images: a realisation's I, Q and U maps as PNGs, rendered once and kept on disk.

The map is the uploaded FITS product whose role is ``iqu`` (HEALPix, fields
I, Q, U in K, ``UNSEEN`` where unobserved). The three images of one map are
rendered together (the FITS file is read once) into::

    <data_dir>/campaigns/<campaign id>/quicklook/<index>-<sha256[:16]>-<I|Q|U>.png

(named by :meth:`service.storage.CampaignStorage.quicklook_image`). The product's
checksum is in the name, so an image never outlives its map;
deleting the campaign removes the folder with the rest of its products.

A map of most of the sky is drawn on healpy's Mollweide projector; a partial-sky
map (a ground patch) zoomed on its patch with the gnomonic or cartesian
projector (:func:`choose_view`). Rendering uses healpy's projectors and matplotlib's Agg canvas
through the object API (no pyplot state), one render at a time per process:
the images are for people, not throughput, and the machine has few cores.
"""

from __future__ import annotations

import io
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schemas.files import atomic_write_bytes
from service.storage import CampaignStorage

log = logging.getLogger("mapcampaign.dashboard")

FIELDS = ("I", "Q", "U")
IMAGE_WIDTH_PX = 640

_render_lock = threading.Lock()  # one render at a time: the CPU is shared with the API and the workers


class MapUnreadable(Exception):
    """The product is not a HEALPix map with I, Q and U."""


def cache_paths(products_dir: Path, campaign_id: int, index: int, sha256: str) -> dict[str, Path]:
    storage = CampaignStorage(products_dir)
    return {field: storage.quicklook_image(campaign_id, index, sha256, field) for field in FIELDS}


def quicklook_png(
    *, products_dir: Path, campaign_id: int, index: int, product_path: Path, sha256: str, field: str
) -> Path:
    """The cached PNG of one field of the realisation's map, rendering the three fields if it is missing."""
    if field not in FIELDS:
        raise ValueError(f"field must be one of {FIELDS}")
    paths = cache_paths(products_dir, campaign_id, index, sha256)
    if paths[field].is_file():
        return paths[field]
    with _render_lock:
        if not paths[field].is_file():  # another request may have rendered it while this one waited
            images = render_iqu(product_path, title=f"realisation {index}")
            for name, png in images.items():
                atomic_write_bytes(paths[name], png)
    return paths[field]


# A map observing less than this fraction of the sky is drawn zoomed on its patch instead of on the whole sky.
ZOOM_BELOW_FSKY = 0.3
# A patch within this radius of its centre is drawn gnomonic (true shapes near the centre); a wider one,
# cartesian (longitude, latitude) over its bounding box, which a gnomonic view cannot hold.
GNOMONIC_MAX_RADIUS_DEG = 30.0
ZOOM_MARGIN = 1.08  # the zoomed view is this much wider than the patch
ZOOM_MAP_PX = 333  # side of the square map of a gnomonic view, in image pixels (the image is 640 x 397)


@dataclass(frozen=True)
class View:
    """How a map is projected: ``mollweide`` (the whole sky), ``gnomonic`` or ``cartesian`` (a zoom)."""

    kind: str
    lon_deg: float = 0.0  # centre of a zoom
    lat_deg: float = 0.0
    radius_deg: float = 180.0  # the patch's extent from the centre (gnomonic)
    lonra_deg: tuple[float, float] = (-180.0, 180.0)  # longitudes relative to lon_deg (cartesian)
    latra_deg: tuple[float, float] = (-90.0, 90.0)


def choose_view(observed: np.ndarray, nside: int) -> View:
    """The projection for a map whose observed pixels (RING indices) are ``observed``, shape (n,)."""
    import healpy as hp  # deferred: see render_iqu

    npix = hp.nside2npix(nside)
    if observed.size == 0 or observed.size >= ZOOM_BELOW_FSKY * npix:
        return View("mollweide")
    vectors = np.array(hp.pix2vec(nside, observed))  # shape (3, n)
    centre = vectors.mean(axis=1)
    norm = float(np.linalg.norm(centre))
    if norm < 1e-6:  # a patch surrounding the sphere's centre (a band all around): no zoom helps
        return View("mollweide")
    centre /= norm
    lon0, lat0 = hp.vec2ang(centre, lonlat=True)
    lon0, lat0 = float(lon0[0]), float(lat0[0])
    pixel_deg = float(np.degrees(hp.nside2resol(nside)))
    # pixel centres lie up to about half a pixel inside the patch edge
    radius = float(np.degrees(np.arccos(np.clip(centre @ vectors, -1.0, 1.0))).max()) + 0.5 * pixel_deg
    if radius <= GNOMONIC_MAX_RADIUS_DEG:
        return View("gnomonic", lon_deg=lon0, lat_deg=lat0, radius_deg=radius)
    lon, lat = hp.pix2ang(nside, observed, lonlat=True)
    relative = (lon - lon0 + 180.0) % 360.0 - 180.0
    margin = pixel_deg
    return View(
        "cartesian",
        lon_deg=lon0,
        lat_deg=lat0,
        lonra_deg=(max(float(relative.min()) - margin, -180.0), min(float(relative.max()) + margin, 180.0)),
        latra_deg=(max(float(lat.min()) - margin, -90.0), min(float(lat.max()) + margin, 90.0)),
    )


def _projector(view: View):
    import healpy as hp  # deferred: see render_iqu

    if view.kind == "gnomonic":
        reso_arcmin = 2.0 * view.radius_deg * ZOOM_MARGIN * 60.0 / ZOOM_MAP_PX
        return hp.projector.GnomonicProj(
            rot=(view.lon_deg, view.lat_deg, 0.0), xsize=ZOOM_MAP_PX, ysize=ZOOM_MAP_PX, reso=reso_arcmin
        )
    if view.kind == "cartesian":
        return hp.projector.CartesianProj(
            rot=(view.lon_deg, 0.0, 0.0),
            xsize=IMAGE_WIDTH_PX,
            ysize=ZOOM_MAP_PX,
            lonra=list(view.lonra_deg),
            latra=list(view.latra_deg),
        )
    return hp.projector.MollweideProj(xsize=IMAGE_WIDTH_PX)


def observed_pixels(maps: np.ndarray) -> np.ndarray:
    """RING indices of the pixels with a value in every field; ``maps`` shape (3, npix), UNSEEN elsewhere."""
    seen = np.all(np.isfinite(maps) & (np.abs(maps) < 1e29), axis=0)  # healpy.UNSEEN is -1.6375e30
    return np.flatnonzero(seen)


def render_iqu(fits_path: Path, *, title: str) -> dict[str, bytes]:
    """PNGs of the I, Q and U fields of a HEALPix FITS map (values in K, shown in uK).

    A map of most of the sky is drawn on a Mollweide view of the whole sky; one of a patch (a ground
    survey) is drawn zoomed on the patch (:func:`choose_view`), where a Mollweide view would show a few
    coloured pixels on a grey sphere.
    """
    import healpy as hp  # deferred: healpy takes 1-3 s to import here, paid only when a map is read or written

    try:
        maps = np.atleast_2d(hp.read_map(str(fits_path), field=(0, 1, 2), dtype=np.float64))
    except Exception as error:  # astropy and healpy raise many kinds for a file that is not a map
        raise MapUnreadable(f"{fits_path.name}: not a HEALPix I/Q/U map ({type(error).__name__})") from error
    if maps.shape[0] != 3 or not hp.isnpixok(maps.shape[1]):
        raise MapUnreadable(f"{fits_path.name}: expected 3 HEALPix fields, found shape {maps.shape}")
    nside = hp.npix2nside(maps.shape[1])
    view = choose_view(observed_pixels(maps), nside)
    projector = _projector(view)
    images = {}
    for field, values in zip(FIELDS, maps, strict=True):
        grid = projector.projmap(values, lambda x, y, z: hp.vec2pix(nside, x, y, z))
        images[field] = _draw(grid, projector.get_extent(), field=field, title=title, view=view)
    return images


# Where the map and the colour bar sit in the 640 x 397 image (figure fractions: left, bottom, width, height).
# Whole sky: a wide map, the bar below it with its unit to its right. Zoomed: a square map, the bar at its right.
@dataclass(frozen=True)
class Layout:
    map: tuple[float, float, float, float]
    bar: tuple[float, float, float, float]
    orientation: str  # of the colour bar


LAYOUTS = {
    "mollweide": Layout(map=(0.01, 0.2, 0.98, 0.68), bar=(0.16, 0.1, 0.6, 0.04), orientation="horizontal"),
    "cartesian": Layout(map=(0.05, 0.2, 0.9, 0.68), bar=(0.16, 0.1, 0.6, 0.04), orientation="horizontal"),
    "gnomonic": Layout(
        map=(0.16, 0.03, ZOOM_MAP_PX / 640, ZOOM_MAP_PX / 397), bar=(0.72, 0.1, 0.03, 0.72), orientation="vertical"
    ),
}
IMAGE_HEIGHT_PX = 397


def _draw(grid, extent, *, field: str, title: str, view: View | None = None) -> bytes:
    figure = draw_figure(grid, extent, field=field, title=title, view=view)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", transparent=False, facecolor="white")
    return buffer.getvalue()


def draw_figure(grid, extent, *, field: str, title: str, view: View | None = None):
    """The matplotlib Figure (Agg canvas) of one projected field; ``grid`` shape (ny, nx) in K, NaN outside."""
    # deferred: matplotlib takes about 2 s to import, paid by the first quick-look image, not the service's start
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    layout = LAYOUTS[view.kind if view is not None else "mollweide"]
    outside = ~np.isfinite(grid)
    unseen = ~outside & (np.abs(grid) > 1e29)  # healpy.UNSEEN is -1.6375e30
    shown = ~outside & ~unseen
    values = np.where(shown, grid, 0.0) * 1e6  # K -> uK
    limit = float(np.percentile(np.abs(values[shown]), 99.0)) if shown.any() else 1.0
    limit = limit if limit > 0 else 1.0
    norm = Normalize(vmin=-limit, vmax=limit)
    cmap = colormaps["RdBu_r"]
    rgba = cmap(norm(values))
    rgba[unseen] = UNSEEN_RGBA
    rgba[outside] = (1.0, 1.0, 1.0, 0.0)

    figure = Figure(figsize=(IMAGE_WIDTH_PX / 100, IMAGE_HEIGHT_PX / 100), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_axes(layout.map)
    axes.imshow(rgba, origin="lower", extent=extent, interpolation="nearest")
    axes.set_axis_off()
    figure.suptitle(f"{field}   ({title})", fontsize=15, y=0.985, va="top")
    bar_axes = figure.add_axes(layout.bar)
    bar = figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=bar_axes, orientation=layout.orientation)
    bar.ax.tick_params(labelsize=11)
    if layout.orientation == "horizontal":
        # The unit beside the bar's right end, where nothing else is drawn and nothing is cut.
        bar_axes.text(
            1.03, 0.5, f"{field} [\u00b5K]", transform=bar_axes.transAxes, va="center", ha="left", fontsize=12
        )
    else:
        bar_axes.set_title(f"{field} [\u00b5K]", fontsize=12, pad=8)
    return figure


UNSEEN_RGBA = (0.78, 0.78, 0.78, 1.0)  # never observed: grey
