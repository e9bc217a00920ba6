"""Quick-look images: a realisation's I, Q and U maps as Mollweide PNGs, rendered once and kept on disk.

The map is the uploaded FITS product whose role is ``iqu`` (HEALPix, fields
I, Q, U in K, ``UNSEEN`` where unobserved). The three images of one map are
rendered together (the FITS file is read once) into::

    <data_dir>/campaigns/<campaign id>/quicklook/<index>-<sha256[:16]>-<I|Q|U>.png

(named by :meth:`service.storage.CampaignStorage.quicklook_image`). The product's
checksum is in the name, so an image never outlives its map;
deleting the campaign removes the folder with the rest of its products.

Rendering uses healpy's Mollweide projector and matplotlib's Agg canvas
through the object API (no pyplot state), one render at a time per process:
the images are for people, not throughput, and the machine has few cores.
"""

from __future__ import annotations

import io
import logging
import threading
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


def render_iqu(fits_path: Path, *, title: str) -> dict[str, bytes]:
    """Mollweide PNGs of the I, Q and U fields of a HEALPix FITS map (values in K, shown in uK)."""
    import healpy as hp  # deferred: healpy takes 1-3 s to import here, paid only when a map is read or written

    try:
        maps = np.atleast_2d(hp.read_map(str(fits_path), field=(0, 1, 2), dtype=np.float64))
    except Exception as error:  # astropy and healpy raise many kinds for a file that is not a map
        raise MapUnreadable(f"{fits_path.name}: not a HEALPix I/Q/U map ({type(error).__name__})") from error
    if maps.shape[0] != 3 or not hp.isnpixok(maps.shape[1]):
        raise MapUnreadable(f"{fits_path.name}: expected 3 HEALPix fields, found shape {maps.shape}")
    nside = hp.npix2nside(maps.shape[1])
    projector = hp.projector.MollweideProj(xsize=IMAGE_WIDTH_PX)
    images = {}
    for field, values in zip(FIELDS, maps, strict=True):
        grid = projector.projmap(values, lambda x, y, z: hp.vec2pix(nside, x, y, z))
        images[field] = _draw(grid, projector.get_extent(), field=field, title=title)
    return images


def _draw(grid, extent, *, field: str, title: str) -> bytes:
    # deferred: matplotlib takes about 2 s to import, paid by the first quick-look image, not the service's start
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    outside = ~np.isfinite(grid)
    unseen = ~outside & (np.abs(grid) > 1e29)  # healpy.UNSEEN is -1.6375e30
    shown = ~outside & ~unseen
    values = np.where(shown, grid, 0.0) * 1e6  # K -> uK
    limit = float(np.percentile(np.abs(values[shown]), 99.0)) if shown.any() else 1.0
    limit = limit if limit > 0 else 1.0
    norm = Normalize(vmin=-limit, vmax=limit)
    cmap = colormaps["RdBu_r"]
    rgba = cmap(norm(values))
    rgba[unseen] = (0.78, 0.78, 0.78, 1.0)
    rgba[outside] = (1.0, 1.0, 1.0, 0.0)

    figure = Figure(figsize=(IMAGE_WIDTH_PX / 100, IMAGE_WIDTH_PX / 100 * 0.62), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0.01, 0.2, 0.98, 0.7))
    axes.imshow(rgba, origin="lower", extent=extent, interpolation="nearest")
    axes.set_axis_off()
    axes.set_title(f"{field}   ({title})", fontsize=15)
    bar_axes = figure.add_axes((0.2, 0.1, 0.6, 0.04))
    bar = figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=bar_axes, orientation="horizontal")
    bar.set_label("\u00b5K", fontsize=12)
    bar.ax.tick_params(labelsize=11)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", transparent=False, facecolor="white")
    return buffer.getvalue()
