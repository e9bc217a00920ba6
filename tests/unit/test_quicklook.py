"""Quick-look map images: a partial-sky (ground) map is drawn zoomed on its patch, a full-sky one on Mollweide,
and no label (the colour bar's unit above all) is cut off. Judged on the rendered pixels and text extents."""

from __future__ import annotations

import io
from pathlib import Path

import healpy as hp
import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.text import Text

from service.dashboard import quicklook

NSIDE = 64
PATCH_CENTRE = (40.0, -30.0)  # lon, lat in degrees
PATCH_RADIUS_DEG = 5.5  # about 110 pixels at nside 64, like a small ground patch


def patch_maps(radius_deg: float = PATCH_RADIUS_DEG) -> tuple[np.ndarray, np.ndarray]:
    """I, Q, U in K, shape (3, npix): values between 50 and 100 uK in a disc, UNSEEN elsewhere."""
    centre = hp.ang2vec(*PATCH_CENTRE, lonlat=True)
    observed = hp.query_disc(NSIDE, centre, np.radians(radius_deg))
    maps = np.full((3, hp.nside2npix(NSIDE)), hp.UNSEEN)
    rng = np.random.default_rng(3)
    maps[:, observed] = (50.0 + 50.0 * rng.random((3, observed.size))) * 1e-6
    return maps, observed


def write(maps: np.ndarray, folder: Path) -> Path:
    path = folder / "map_iqu.fits"
    hp.write_map(str(path), maps, dtype=np.float64, column_units="K")
    return path


def patch_fraction(png: bytes, box: tuple[float, float, float, float]) -> float:
    """Fraction of the map box's pixels coloured by data (reddish: positive values), not background or grey."""
    image = imread(io.BytesIO(png))[..., :3]  # shape (397, 640, 3), rows from the top
    height, width = image.shape[:2]
    left, bottom, box_width, box_height = box
    rows = slice(int((1 - bottom - box_height) * height), int((1 - bottom) * height))
    columns = slice(int(left * width), int((left + box_width) * width))
    inside = image[rows, columns]
    red, green, blue = inside[..., 0], inside[..., 1], inside[..., 2]
    reddish = (red > green + 0.15) & (red > blue + 0.15)
    return float(reddish.mean())


def test_a_ground_patch_is_drawn_gnomonic_and_fills_most_of_the_map(tmp_path):
    maps, observed = patch_maps()
    assert 90 <= observed.size <= 130
    view = quicklook.choose_view(quicklook.observed_pixels(maps), NSIDE)
    assert view.kind == "gnomonic"
    assert view.lon_deg == pytest.approx(PATCH_CENTRE[0], abs=1.0)
    assert view.lat_deg == pytest.approx(PATCH_CENTRE[1], abs=1.0)
    assert view.radius_deg == pytest.approx(PATCH_RADIUS_DEG, abs=1.5)

    images = quicklook.render_iqu(write(maps, tmp_path), title="ground")
    zoomed = patch_fraction(images["I"], quicklook.LAYOUTS["gnomonic"].map)
    # A disc in a square view ZOOM_MARGIN wider than it: pi / 4 / 1.08^2 = 0.67 of the square, less the
    # pixels' jagged edge.
    assert zoomed > 0.5, zoomed

    # The same map on the whole sky, as it used to be drawn: a speck.
    projector = hp.projector.MollweideProj(xsize=quicklook.IMAGE_WIDTH_PX)
    grid = projector.projmap(maps[0], lambda x, y, z: hp.vec2pix(NSIDE, x, y, z))
    whole = quicklook._draw(grid, projector.get_extent(), field="I", title="ground")
    assert patch_fraction(whole, quicklook.LAYOUTS["mollweide"].map) < 0.01


def test_a_wide_partial_sky_is_drawn_cartesian_and_a_full_sky_on_mollweide(tmp_path):
    maps, _ = patch_maps(radius_deg=45.0)  # 15 % of the sky: too wide for a gnomonic view
    view = quicklook.choose_view(quicklook.observed_pixels(maps), NSIDE)
    assert view.kind == "cartesian"
    assert view.latra_deg[0] == pytest.approx(PATCH_CENTRE[1] - 45.0, abs=2.0)
    assert view.latra_deg[1] == pytest.approx(PATCH_CENTRE[1] + 45.0, abs=2.0)
    images = quicklook.render_iqu(write(maps, tmp_path), title="wide")
    assert patch_fraction(images["Q"], quicklook.LAYOUTS["cartesian"].map) > 0.35

    full = np.full((3, hp.nside2npix(NSIDE)), 1e-5)
    theta, _ = hp.pix2ang(NSIDE, np.arange(full.shape[1]))
    full[:, theta < np.radians(25)] = hp.UNSEEN  # a satellite's unobserved polar cap
    assert quicklook.choose_view(quicklook.observed_pixels(full), NSIDE).kind == "mollweide"


@pytest.mark.parametrize("kind", ["mollweide", "gnomonic", "cartesian"])
def test_no_label_is_cut_off(kind):
    grid = np.linspace(-1e-4, 1e-4, 200 * 300).reshape(200, 300)
    view = quicklook.View(kind)
    figure = quicklook.draw_figure(grid, (-1, 1, -1, 1), field="U", title="realisation 12345", view=view)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    labels = [text for text in figure.findobj(Text) if text.get_visible() and text.get_text().strip()]
    assert "U [\u00b5K]" in [text.get_text() for text in labels]
    for text in labels:
        extent = text.get_window_extent(renderer)
        assert extent.x0 >= 0 and extent.y0 >= 0, text.get_text()
        assert extent.x1 <= quicklook.IMAGE_WIDTH_PX and extent.y1 <= quicklook.IMAGE_HEIGHT_PX, text.get_text()


def test_a_cut_sky_map_file_is_drawn_like_its_full_sky_form(tmp_path):
    """The map-maker's cut-sky file (explicit indexing over the observed pixels) gives the same images."""
    from mapmaker.programs.products import write_cut_sky

    maps, observed = patch_maps()
    cut = tmp_path / "cut.fits"
    columns = {name: maps[field, observed] for field, name in enumerate(("I_STOKES", "Q_STOKES", "U_STOKES"))}
    write_cut_sky(cut, observed, columns, nside=NSIDE, coord="C", header=[], unit="K")
    (tmp_path / "full").mkdir()
    full_path = write(maps, tmp_path / "full")
    assert cut.stat().st_size < full_path.stat().st_size / 10
    full = quicklook.render_iqu(full_path, title="ground")
    assert quicklook.render_iqu(cut, title="ground") == full
