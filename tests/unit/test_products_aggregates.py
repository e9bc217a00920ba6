"""service.products.aggregates on made-up realisations: Welford against numpy, the ledger, idempotence,
crash leftovers, concurrent updates, and what is left out (with a warning) rather than failing.

"Equal to numpy" is ``|running - batch| <= 1e-12 * scale`` with ``scale`` the RMS of the values
(per bin or pixel): a relative error against the mean itself would be meaningless where the mean
crosses zero (cross spectra, noise maps).
"""

import json
import threading

import healpy as hp
import numpy as np
import pytest

from schemas.result import SPECTRA
from service.products import aggregates
from service.products.aggregates import (
    include_realization,
    ledger_add,
    ledger_contains,
    ledger_count,
    load_state,
    spectra_aggregates,
)
from service.products.mapsums import mean_and_variance_maps
from service.storage import CampaignProducts

NSIDE = 4
BINS = 3


def assert_close_to_batch(running, values, axis=0):
    scale = np.sqrt(np.mean(np.asarray(values) ** 2, axis=axis))
    np.testing.assert_array_less(np.abs(running - np.mean(values, axis=axis)), 1e-12 * scale + 1e-300)


def make_realization(folder, index, seed=0, signal=False, noise=True, mask_payload=None):
    """A result with binned spectra and an I/Q/U FITS map (a polar cap unobserved), as a worker uploads them."""
    generator = np.random.default_rng(1000 * seed + index)
    product_dir = folder / f"r{index}"
    product_dir.mkdir(parents=True)
    npix = hp.nside2npix(NSIDE)
    iqu = 1e-5 + 1e-6 * generator.standard_normal((3, npix))
    iqu[:, :12] = hp.UNSEEN
    hp.write_map(str(product_dir / "map_iqu.fits"), iqu, dtype=np.float64)
    mask = np.ones(npix)
    mask[:12] = 0
    hp.write_map(str(product_dir / "mask.fits"), mask, dtype=np.float64)
    if mask_payload is not None:
        (product_dir / "mask.fits").write_bytes(mask_payload)
    cl = {name: (1e-12 * (1 + 0.1 * generator.standard_normal(BINS))).tolist() for name in SPECTRA}
    cl["TE"] = (1e-13 * generator.standard_normal(BINS)).tolist()  # crosses zero
    result = {
        "realization": index,
        "spec_hash": "a" * 64,
        "products": [
            {"name": "iqu", "path": "map_iqu.fits", "sha256": "x", "size_bytes": 1},
            {"name": "mask", "path": "mask.fits", "sha256": "x", "size_bytes": 1},
        ],
        "spectra": {
            "ell_min": [2, 6, 10],
            "ell_max": [5, 9, 12],
            "lmax": 12,
            "ell_bin_width": 4,
            "cl": cl,
            "w2": 0.5,
            "fsky": 0.75,
            "apodization_deg": 5.0,
            "min_hits": 3,
            "signal": signal,
            "noise": noise,
            "model": {name: [2e-12] * BINS for name in SPECTRA} if signal else None,
            "beam_fwhm_arcmin": 60.0 if signal else None,
        },
    }
    return result, product_dir, iqu, cl


def test_welford_equals_numpy_mean_and_std():
    generator = np.random.default_rng(5)
    values = 3.0 + 1e-3 * generator.standard_normal((500, 7))  # small scatter on a large mean
    mean, m2 = np.zeros(7), np.zeros(7)
    for count, row in enumerate(values):
        mean, m2 = aggregates.welford_add(count, mean, m2, row)
    assert_close_to_batch(mean, values)
    np.testing.assert_allclose(aggregates.sample_std(500, m2), np.std(values, axis=0, ddof=1), rtol=1e-10)
    with pytest.raises(ValueError, match="two samples"):
        aggregates.sample_std(1, m2)


def test_ledger_ranges():
    ranges = []
    for index in (5, 3, 4, 10, 0, 11, 1):
        ranges = ledger_add(ranges, index)
    assert ranges == [[0, 2], [3, 6], [10, 12]]
    assert ledger_count(ranges) == 7 and ledger_contains(ranges, 4) and not ledger_contains(ranges, 2)
    assert ledger_add(ranges, 2) == [[0, 6], [10, 12]]
    assert list(aggregates.ledger_indexes([[0, 2], [5, 6]])) == [0, 1, 5]


def test_running_aggregates_equal_the_batch_and_updates_are_idempotent(tmp_path):
    files = CampaignProducts(tmp_path / "campaigns", 7)
    made = [make_realization(tmp_path / "uploads", index) for index in range(6)]
    for result, product_dir, _, _ in made:
        assert include_realization(files, result["realization"], result, product_dir)
    generation = load_state(files).generation
    for result, product_dir, _, _ in made[:3]:  # offered again (hook + reconciler): no change
        assert not include_realization(files, result["realization"], result, product_dir)
    state = load_state(files)
    assert state.generation == generation and state.n_included == state.n_spectra == state.n_maps == 6
    assert state.included == [[0, 6]] and state.mask["realization"] == 0 and not state.warnings

    spectra = spectra_aggregates(state)
    for name in SPECTRA:
        values = np.array([cl[name] for _, _, _, cl in made])
        assert_close_to_batch(spectra.mean[name], values)
        np.testing.assert_allclose(spectra.std[name], np.std(values, axis=0, ddof=1), rtol=1e-10)
    bias = spectra.noise_bias()
    np.testing.assert_allclose(bias["TT"][0], spectra.mean["TT"] / 0.5, rtol=1e-15)
    assert spectra.noise_bias_available and not spectra.transfer_available

    mean_map, variance_map = mean_and_variance_maps(files, state)
    maps = np.array([iqu for _, _, iqu, _ in made])
    seen = slice(12, None)
    assert np.all(mean_map[:, :12] == hp.UNSEEN) and np.all(variance_map[:, :12] == hp.UNSEEN)
    assert_close_to_batch(mean_map[:, seen], maps[:, :, seen])
    np.testing.assert_allclose(variance_map[:, seen], np.var(maps[:, :, seen], axis=0, ddof=1), rtol=1e-10)
    assert [p.name for p in files.root.glob("mapsums-*.npz")] == [state.maps["file"]]


def test_transfer_function_uses_the_model_and_w2(tmp_path):
    files = CampaignProducts(tmp_path / "campaigns", 1)
    made = [make_realization(tmp_path / "uploads", index, signal=True, noise=False) for index in range(3)]
    for result, product_dir, _, _ in made:
        include_realization(files, result["realization"], result, product_dir)
    spectra = spectra_aggregates(load_state(files))
    assert spectra.transfer_available and not spectra.noise_bias_available
    value, scatter = spectra.transfer_function()["EE"]
    np.testing.assert_allclose(value, spectra.mean["EE"] / (0.5 * 2e-12), rtol=1e-14)
    np.testing.assert_allclose(scatter, spectra.std["EE"] / (0.5 * 2e-12), rtol=1e-14)


def test_a_crash_before_the_state_rename_leaves_the_old_state(tmp_path):
    """A map-sum file written for a generation that was never committed is ignored, then removed."""
    files = CampaignProducts(tmp_path / "campaigns", 3)
    made = [make_realization(tmp_path / "uploads", index) for index in range(3)]
    include_realization(files, 0, made[0][0], made[0][1])
    state = load_state(files)
    stray = files.map_sums_path(state.generation + 1)
    stray.write_bytes(b"half-written by a process that was killed")
    (files.root / ".state.json.1234.partial").write_text("{")
    assert load_state(files).n_included == 1  # the committed state still rules
    include_realization(files, 1, made[1][0], made[1][1])
    include_realization(files, 2, made[2][0], made[2][1])
    state = load_state(files)
    assert state.n_included == 3 and state.n_maps == 3
    assert [p.name for p in files.root.glob("mapsums-*.npz")] == [state.maps["file"]]
    maps = np.array([iqu for _, _, iqu, _ in made])
    assert_close_to_batch(mean_and_variance_maps(files, state)[0][:, 12:], maps[:, :, 12:])


def test_unusable_parts_are_left_out_with_a_warning(tmp_path):
    files = CampaignProducts(tmp_path / "campaigns", 4)
    first, first_dir, _, _ = make_realization(tmp_path / "uploads", 0)
    include_realization(files, 0, first, first_dir)
    other, other_dir, _, _ = make_realization(tmp_path / "uploads", 1, mask_payload=b"SIMPLE  = T")
    other["spectra"]["ell_bin_width"] = 8  # another binning
    (other_dir / "map_iqu.fits").write_bytes(b"not a map")
    assert include_realization(files, 1, other, other_dir)
    no_products = {"realization": 2, "spec_hash": "a" * 64, "products": []}  # e.g. an older worker's result
    assert include_realization(files, 2, no_products, tmp_path / "nowhere")
    state = load_state(files)
    assert state.n_included == 3 and state.n_spectra == 1 and state.n_maps == 1
    text = " ".join(state.warnings)
    assert "ell_bin_width" in text and "map_iqu.fits" in text and "mask differs" in text


def test_an_unreadable_state_is_set_aside_and_started_again(tmp_path):
    files = CampaignProducts(tmp_path / "campaigns", 5)
    result, product_dir, _, _ = make_realization(tmp_path / "uploads", 0)
    include_realization(files, 0, result, product_dir)
    files.state_path.write_text("{not json")
    assert load_state(files) is None
    assert list(files.root.glob("state.json.unreadable-*"))
    assert include_realization(files, 0, result, product_dir)  # the reconciler re-adds everything from the inputs


def test_state_of_a_deleted_campaign_with_a_reused_id_is_not_mixed_in(tmp_path):
    files = CampaignProducts(tmp_path / "campaigns", 6)
    old, old_dir, _, _ = make_realization(tmp_path / "old", 0)
    include_realization(files, 0, old, old_dir)
    new, new_dir, _, cl = make_realization(tmp_path / "new", 0, seed=1)
    new["spec_hash"] = "b" * 64
    assert include_realization(files, 0, new, new_dir)
    state = load_state(files)
    assert state.spec_hash == "b" * 64 and state.n_included == 1
    np.testing.assert_array_equal(spectra_aggregates(state).mean["TT"], cl["TT"])


def test_concurrent_updates_of_one_campaign_do_not_race(tmp_path):
    """Eight threads, each with its own open of the lock file (as separate processes would have)."""
    files = CampaignProducts(tmp_path / "campaigns", 8)
    made = [make_realization(tmp_path / "uploads", index) for index in range(16)]
    errors = []

    def work(chunk):
        try:
            for result, product_dir, _, _ in chunk:
                include_realization(CampaignProducts(files.products_dir, 8), result["realization"], result, product_dir)
                include_realization(files, result["realization"], result, product_dir)  # and once more
        except Exception as error:  # noqa: BLE001 - any error of a racing writer is reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(made[k::8],)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    state = load_state(files)
    assert state.n_included == state.n_spectra == state.n_maps == 16 and state.generation == 16
    values = np.array([cl["TT"] for _, _, _, cl in made])
    assert_close_to_batch(spectra_aggregates(state).mean["TT"], values)
    maps = np.array([iqu for _, _, iqu, _ in made])
    assert_close_to_batch(mean_and_variance_maps(files, state)[0][:, 12:], maps[:, :, 12:])


def test_state_is_small_and_json(tmp_path):
    files = CampaignProducts(tmp_path / "campaigns", 9)
    for index in range(5):
        result, product_dir, _, _ = make_realization(tmp_path / "uploads", index)
        include_realization(files, index, result, product_dir)
    data = json.loads(files.state_path.read_text())
    assert data["format"] == 1 and data["included"] == [[0, 5]] and data["spectra"]["n"] == 5


@pytest.mark.parametrize("bad", ["cl", "length", "nan"])
def test_malformed_spectra_are_left_out(tmp_path, bad):
    files = CampaignProducts(tmp_path / "campaigns", 10)
    result, product_dir, _, _ = make_realization(tmp_path / "uploads", 0)
    if bad == "cl":
        del result["spectra"]["cl"]["EB"]
    elif bad == "length":
        result["spectra"]["cl"]["TT"] = [1.0]
    else:
        result["spectra"]["cl"]["TT"][0] = float("nan")
    assert include_realization(files, 0, result, product_dir)
    state = load_state(files)
    assert state.n_spectra == 0 and state.n_maps == 1 and state.warnings


# --------------------------------------------------------------------------- decoupled bandpowers


def bandpower_record(generator, n_bins=4, mask_sha256="m" * 64, **changes):
    """A ``BinnedSpectra`` record (as data) whose decoupled bandpowers scatter around a known level."""
    cb = {name: (1e-12 * (1 + 0.1 * generator.standard_normal(n_bins))).tolist() for name in SPECTRA}
    record = {
        "ell_min": [2 + 4 * b for b in range(n_bins)],
        "ell_max": [5 + 4 * b for b in range(n_bins)],
        "lmax": 4 * n_bins + 2,
        "ell_bin_width": 4,
        "cl": cb,
        "w2": 0.5,
        "fsky": 0.75,
        "apodization_deg": 5.0,
        "min_hits": 3,
        "signal": True,
        "noise": False,
        "model": None,
        "beam_fwhm_arcmin": None,
        "bandpowers": {
            "ell_lo": [2 + 4 * b for b in range(n_bins)],
            "ell_hi": [5 + 4 * b for b in range(n_bins)],
            "lmax": 4 * n_bins + 3,
            "bin_width": 4,
            "reliable": [True] * n_bins,
            "purify_b": True,
            "cb": cb,
            "model": {name: [1e-12] * n_bins for name in SPECTRA},
            "mask_sha256": mask_sha256,
            "coupling_source": "built",
            "bandpowers_s": 0.1,
        },
    }
    record["bandpowers"].update(changes)
    return record


def test_bandpower_covariance_and_transfer_equal_the_batch_kernels(tmp_path):
    """The running mean and co-moment give campaignlib.montecarlo's batch covariance, transfer and Hartlap factor."""
    from campaignlib import montecarlo

    files = CampaignProducts(tmp_path / "campaigns", 8)
    generator = np.random.default_rng(21)
    records = [bandpower_record(generator) for _ in range(30)]
    for index, record in enumerate(records):
        assert include_realization(files, index, {"realization": index, "spec_hash": "b" * 64, "spectra": record})
    state = load_state(files)
    bandpowers = aggregates.bandpower_aggregates(files, state)
    samples = np.array([[record["bandpowers"]["cb"][name] for name in SPECTRA] for record in records])
    covariance, n, hartlap = montecarlo.bandpower_covariance(samples)
    assert bandpowers.n == n == 30 and bandpowers.hartlap == pytest.approx(hartlap) == (30 - 24 - 2) / 29
    scale = np.sqrt(np.outer(np.diag(covariance), np.diag(covariance)))
    np.testing.assert_array_less(np.abs(bandpowers.covariance - covariance), 1e-10 * scale)
    assert_close_to_batch(bandpowers.mean, samples)
    transfer, sigma = montecarlo.transfer_function(samples, np.full((6, 4), 1e-12))
    assert bandpowers.transfer_available and not bandpowers.noise_bias_available
    np.testing.assert_allclose(bandpowers.transfer_function()[0], transfer, rtol=1e-10)
    np.testing.assert_allclose(bandpowers.transfer_function()[1], sigma, rtol=1e-8)
    assert len(list(files.bandpower_sums_files())) == 1  # older generations removed


def test_bandpowers_of_another_mask_or_binning_are_left_out_with_a_warning(tmp_path):
    files = CampaignProducts(tmp_path / "campaigns", 9)
    generator = np.random.default_rng(22)
    include_realization(files, 0, {"realization": 0, "spec_hash": "b" * 64, "spectra": bandpower_record(generator)})
    other_mask = bandpower_record(generator, mask_sha256="n" * 64)
    include_realization(files, 1, {"realization": 1, "spec_hash": "b" * 64, "spectra": other_mask})
    other_bins = bandpower_record(generator, n_bins=3)
    include_realization(files, 2, {"realization": 2, "spec_hash": "b" * 64, "spectra": other_bins})
    state = load_state(files)
    assert state.n_bandpowers == 1 and state.n_included == 3
    assert any("bandpowers differ from the campaign's in mask_sha256" in w for w in state.warnings), state.warnings
    assert any("ell_lo, ell_hi, lmax" in w for w in state.warnings), state.warnings
