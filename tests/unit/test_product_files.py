"""A realisation's map files in HEALPix cut-sky form: what healpy reads back, what the service reads, and the bytes.

Maps, hits and rcond are written over the observed pixels only (explicit indexing); the service's
aggregates read those and the full-sky files of older realisations alike, and refuse a cut-sky file
whose pixel list does not fit its nside. The map update's memory is bounded in map-sized units.
"""

import tracemalloc
from pathlib import Path

import healpy as hp
import numpy as np
import pytest
from astropy.io import fits

from campaignlib.healpixfile import NotAHealpixMap, read_healpix_fields
from mapmaker.programs import products
from schemas.io import load_spec
from schemas.spec import _sha256, spec_hash
from service.products import aggregates
from service.products.aggregates import include_realization, load_map_sums, load_state
from service.storage import CampaignProducts

NSIDE = 32
HEADER_ALLOWANCE = 3 * 2880  # a FITS file's primary header, its table's header and the padding of its last data block


def observed_patch(seed: int, nside: int = NSIDE, fraction: float = 0.1):
    """Hits > 0 on a polar cap of about ``fraction`` of the sky, a cut pixel inside, and the I/Q/U and rcond maps."""
    generator = np.random.default_rng(seed)
    npix = hp.nside2npix(nside)
    observed = np.arange(int(fraction * npix))
    hits = np.zeros(npix, dtype=np.int64)
    hits[observed] = generator.integers(1, 500, observed.size)
    iqu = np.full((3, npix), hp.UNSEEN)
    iqu[:, observed] = 1e-5 * generator.standard_normal((3, observed.size))
    iqu[:, observed[5]] = hp.UNSEEN  # observed but cut by rcond
    rcond = np.full(npix, hp.UNSEEN)
    rcond[observed] = generator.uniform(0.01, 0.33, observed.size)
    return iqu, hits, rcond


def write(tmp_path, name, iqu, hits, rcond, precision="float64"):
    folder = products.ProductFolder(tmp_path / name)
    records = products.write_maps(folder, iqu, hits, rcond, [("REALIZ", 1)], "C", precision)
    return folder.commit(), {record.name: record for record in records}


def test_cut_sky_files_read_back_as_the_full_maps_with_healpy(tmp_path):
    iqu, hits, rcond = observed_patch(1)
    out, _ = write(tmp_path, "r1", iqu, hits, rcond)
    np.testing.assert_array_equal(hp.read_map(out / "map_iqu.fits", field=(0, 1, 2), dtype=np.float64), iqu)
    read_hits = hp.read_map(out / "hits.fits", dtype=np.float64)
    np.testing.assert_array_equal(np.where(read_hits == hp.UNSEEN, 0, read_hits), hits)
    np.testing.assert_allclose(hp.read_map(out / "rcond.fits", dtype=np.float64)[hits > 0], rcond[hits > 0], rtol=1e-7)
    with fits.open(out / "hits.fits") as hdus:
        header = hdus[1].header
        assert header["INDXSCHM"] == "EXPLICIT" and header["OBJECT"] == "PARTIAL" and header["NSIDE"] == NSIDE
        assert hdus[1].data["HITS"].dtype == np.dtype(">i4") and hdus[1].data["PIXEL"].size == np.count_nonzero(hits)


def test_map_files_take_at_most_48_bytes_per_observed_pixel_and_float32_halves_the_map(tmp_path):
    iqu, hits, rcond = observed_patch(2, nside=64)
    n_observed = np.count_nonzero(hits)
    _, records = write(tmp_path, "r64", iqu, hits, rcond)
    _, records32 = write(tmp_path, "r32", iqu, hits, rcond, "float32")
    total = sum(record.size_bytes for record in records.values())
    assert total <= 48 * n_observed + 3 * HEADER_ALLOWANCE
    full_sky_float64 = 3 * 8 * hits.size + 8 * hits.size + 8 * hits.size  # the former iqu, hits (int64) and rcond
    assert total < 0.15 * full_sky_float64  # an fsky of 0.1: the files shrink by about it
    # IQU float32: 4 index bytes + 12 value bytes per pixel, against 4 + 24.
    assert records32["iqu"].size_bytes <= (16 * n_observed + HEADER_ALLOWANCE)
    assert records["iqu"].size_bytes >= 28 * n_observed
    single = hp.read_map(tmp_path / "r32" / "map_iqu.fits", field=(0, 1, 2), dtype=np.float64)
    seen = iqu != hp.UNSEEN
    np.testing.assert_allclose(single[seen], iqu[seen], rtol=1e-7)


def test_map_precision_default_keeps_the_spec_hash_of_specs_without_it():
    spec = load_spec(Path(__file__).parents[2] / "schemas" / "examples" / "satellite.toml")
    data = spec.model_dump(mode="json")
    data.pop("realizations")
    # a spec as written before the option existed, and before the other fields added since
    for section, name in (("products", "map_precision"), ("sky", "polarization"), ("sky", "power_law"),
                          ("solver", "pointing"), ("solver", "coarse_stokes")):
        del data[section][name]
    assert spec.products.map_precision == "float64" and spec_hash(spec) == _sha256(data)
    single = spec.model_copy(update={"products": spec.products.model_copy(update={"map_precision": "float32"})})
    assert spec_hash(single) != spec_hash(spec)
    i_only = spec.model_copy(update={"solver": spec.solver.model_copy(update={"coarse_stokes": "I"})})
    assert spec_hash(i_only) != spec_hash(spec)


def result_for(index, product_dir):
    return {
        "realization": index,
        "spec_hash": "b" * 64,
        "products": [{"name": "iqu", "path": "map_iqu.fits", "sha256": "x", "size_bytes": 1}],
    }


def test_aggregates_of_cut_sky_maps_equal_those_of_old_full_sky_files(tmp_path):
    """Realisations of the old form (full sky, float64) and the new one give the same mean and M2."""
    maps = [observed_patch(seed)[0] for seed in range(4)]
    hits = observed_patch(0)[1]
    rcond = observed_patch(0)[2]
    old_files = CampaignProducts(tmp_path / "old", 1)
    new_files = CampaignProducts(tmp_path / "mixed", 2)
    for index, iqu in enumerate(maps):
        full_dir = tmp_path / "full" / f"r{index}"
        full_dir.mkdir(parents=True)
        hp.write_map(str(full_dir / "map_iqu.fits"), iqu, dtype=np.float64)  # the form every reader met before
        cut_dir, _ = write(tmp_path / "cut", f"r{index}", iqu, hits, rcond)
        assert include_realization(old_files, index, result_for(index, full_dir), full_dir)
        mixed_dir = full_dir if index % 2 else cut_dir  # a campaign with realisations of both forms
        assert include_realization(new_files, index, result_for(index, mixed_dir), mixed_dir)
    old = load_map_sums(old_files, load_state(old_files))
    new = load_map_sums(new_files, load_state(new_files))
    assert not load_state(new_files).warnings
    np.testing.assert_array_equal(old["count"], new["count"])
    assert old["count"].max() == 4 and old["count"][5] == 0  # the cut pixel never entered
    np.testing.assert_allclose(new["mean"], old["mean"], rtol=0, atol=1e-20)
    np.testing.assert_allclose(new["m2"], old["m2"], rtol=1e-12, atol=1e-30)


@pytest.mark.parametrize(
    ("pixels", "words"),
    [
        (np.array([-1, 2, 3], dtype=np.int32), "outside"),
        (np.array([1, 2, 12 * NSIDE**2], dtype=np.int32), "outside"),
        (np.array([1, 2, 2], dtype=np.int32), "twice"),
        (np.array([7, 1, 5, 1], dtype=np.int32), "twice"),  # apart, and not in order
    ],
)
def test_a_cut_sky_file_whose_pixels_do_not_fit_is_refused(tmp_path, pixels, words):
    path = tmp_path / "bad.fits"
    columns = {name: np.ones(pixels.size) for name in ("I_STOKES", "Q_STOKES", "U_STOKES")}
    products.write_cut_sky(path, pixels, columns, nside=NSIDE, coord="C", header=[])
    with pytest.raises(NotAHealpixMap, match=words):
        read_healpix_fields(path, 3)
    files = CampaignProducts(tmp_path / "campaigns", 3)
    (tmp_path / "r0").mkdir()
    path.rename(tmp_path / "r0" / "map_iqu.fits")
    assert include_realization(files, 0, result_for(0, tmp_path / "r0"), tmp_path / "r0")
    state = load_state(files)
    assert state.n_maps == 0 and any("not a HEALPix I/Q/U map" in warning for warning in state.warnings)


def map_update_peak(tmp_path, nside, fraction):
    """Peak bytes traced while one realisation's cut-sky map enters sums that already hold one."""
    iqu, hits, rcond = observed_patch(7, nside=nside, fraction=fraction)
    files = CampaignProducts(tmp_path / f"c{nside}-{fraction}", 1)
    folder, _ = write(tmp_path, f"m{nside}-{fraction}-0", iqu, hits, rcond)
    include_realization(files, 0, result_for(0, folder), folder)
    folder, _ = write(tmp_path, f"m{nside}-{fraction}-1", iqu, hits, rcond)
    tracemalloc.start()
    try:
        assert include_realization(files, 1, result_for(1, folder), folder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("fraction", [0.1, 1.0])
def test_a_map_update_takes_a_few_map_sized_arrays(tmp_path, monkeypatch, fraction):
    """Peak memory of one update below 5.5 I/Q/U float64 maps (one: 24 npix bytes).

    The sums (count, mean, M2) are 7/3 of one, the file's values and pixel indexes 4/3, read through
    a table of the same size. The update's slices are set to the same fraction of the map as at nside 1024.
    """
    nside = 128
    monkeypatch.setattr(aggregates, "MAP_UPDATE_PIXELS", aggregates.MAP_UPDATE_PIXELS * hp.nside2npix(nside) // hp.nside2npix(1024))
    iqu_map_bytes = 24 * hp.nside2npix(nside)
    peak = map_update_peak(tmp_path, nside, fraction)
    print(f"\nnside {nside}, fsky {fraction}: peak {peak / iqu_map_bytes:.2f} I/Q/U maps")
    assert peak < 5.5 * iqu_map_bytes
    assert peak > 7 / 3 * iqu_map_bytes  # the sums are loaded whole: the measure sees them


def test_read_healpix_fields_gives_the_pixels_of_a_cut_sky_file_without_filling_the_sky(tmp_path):
    iqu, hits, rcond = observed_patch(3)
    out, _ = write(tmp_path, "r3", iqu, hits, rcond)
    npix, pixels, values = read_healpix_fields(out / "map_iqu.fits", 3)
    assert npix == hits.size and values.shape == (3, np.count_nonzero(hits))
    np.testing.assert_array_equal(pixels, np.flatnonzero(hits))
    np.testing.assert_array_equal(values, iqu[:, pixels])
    full_dir = tmp_path / "full"
    full_dir.mkdir()
    hp.write_map(str(full_dir / "m.fits"), iqu, dtype=np.float64)
    npix, pixels, values = read_healpix_fields(full_dir / "m.fits", 3)
    assert pixels is None and values.shape == (3, hits.size)
    assert aggregates.UNSEEN == hp.UNSEEN
