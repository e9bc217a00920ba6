"""The worker's store of kept maps: moved maps named in the result, the journal, crash repair, bounded sends."""

from __future__ import annotations

import json

import healpy as hp
import numpy as np
import pytest

from campaignlib import sitesums
from schemas.api import SiteSumsReceipt
from schemas.files import sha256_file
from schemas.result import ProductFile, RealizationResult
from tests.support.clock import FakeClock
from tests.support.service_helpers import result_for, spec_data
from worker.keep import SiteStore
from worker.site import SiteError, parse_site

NSIDE = 4


def _result(folder, index, rng):
    iqu = rng.normal(size=(3, 12 * NSIDE**2))
    iqu[:, : 10 + index] = hp.UNSEEN  # partial skies that differ
    folder.mkdir(parents=True)
    hp.write_map(str(folder / "map_iqu.fits"), iqu, dtype=np.float64)
    (folder / "spectra.json").write_text("{}")
    products = [
        ProductFile(name=name, path=path, sha256=sha256_file(folder / path), size_bytes=(folder / path).stat().st_size)
        for name, path in (("iqu", "map_iqu.fits"), ("spectra", "spectra.json"))
    ]
    data = result_for(spec_data(), index, [p.model_dump() for p in products])
    return RealizationResult.model_validate(data), iqu


class Sender:
    def __init__(self):
        self.sent = []

    def put_map_sums(self, worker_id, campaign_id, path):
        sums = sitesums.read(path)
        self.sent.append((campaign_id, sums.version))
        return SiteSumsReceipt(campaign_id=campaign_id, site="a", version=sums.version, pixels=int(sums.pixels.size))


@pytest.fixture
def store(tmp_path):
    made = SiteStore(tmp_path / "store", "a", interval_s=60.0, clock=FakeClock())
    made.worker_id = 1
    return made


def test_kept_maps_move_to_the_store_and_the_result_names_them(store, tmp_path):
    result, _ = _result(tmp_path / "out", 3, np.random.default_rng(0))
    kept = store.keep_maps(result, tmp_path / "out", 7)
    iqu, spectra = kept.products
    assert iqu.kept.site == "a" and iqu.kept.path == str(store.campaign_dir(7) / "3" / "map_iqu.fits")
    assert sha256_file(iqu.kept.path) == iqu.sha256 and not (tmp_path / "out" / "map_iqu.fits").exists()
    assert spectra.kept is None and (tmp_path / "out" / "spectra.json").exists()


def test_accepted_maps_join_the_sums_once_and_a_crash_is_repaired(store, tmp_path):
    rng = np.random.default_rng(1)
    maps = {}
    for index in range(3):
        result, maps[index] = _result(tmp_path / f"out{index}", index, rng)
        result = store.keep_maps(result, tmp_path / f"out{index}", 7)
        if index < 2:
            store.accepted(7, result)
        else:  # killed after journalling, before the sums were written
            journal = store.campaign_dir(7) / "journal"
            (journal / "2.json").write_text(json.dumps({"iqu": result.products[0].kept.path}))
    (store.campaign_dir(7) / "journal" / "1.json").write_text(  # killed after the sums, before the entry went
        json.dumps({"iqu": str(store.campaign_dir(7) / "1" / "map_iqu.fits")})
    )
    assert sitesums.read(store.campaign_dir(7) / "sums.npz").ledger == [[0, 2]]
    store.repair()
    sums = sitesums.read(store.campaign_dir(7) / "sums.npz")
    assert sums.ledger == [[0, 3]] and not list((store.campaign_dir(7) / "journal").iterdir())
    stack = np.where(np.array(list(maps.values())) == hp.UNSEEN, np.nan, np.array(list(maps.values())))
    count = np.sum(np.isfinite(stack[:, 0]), axis=0)
    np.testing.assert_array_equal(sums.count, count[count > 0])  # realisation 1 counted once
    np.testing.assert_allclose(sums.mean, np.nanmean(stack[:, :, count > 0], axis=0), rtol=1e-12)


def test_sends_are_bounded_by_the_interval_and_forced_at_the_end(store, tmp_path):
    rng = np.random.default_rng(2)
    sender = Sender()
    for index in range(3):
        result, _ = _result(tmp_path / f"out{index}", index, rng)
        store.accepted(7, store.keep_maps(result, tmp_path / f"out{index}", 7))
        store.send(sender, 7)
    assert sender.sent == [(7, 1)]  # the two later sends fell within the interval
    store.clock.advance(61.0)
    assert store.send(sender, 7) and sender.sent[-1] == (7, 3)
    assert not store.send(sender, 7, force=True)  # nothing new since the acknowledged send
    result, _ = _result(tmp_path / "out3", 3, rng)
    store.accepted(7, store.keep_maps(result, tmp_path / "out3", 7))
    store.send_all(sender)
    assert sender.sent[-1] == (7, 4)


def test_the_products_setting_is_checked_naming_the_field(tmp_path):
    base = {"name": "s", "provider": {"kind": "local"}}
    with pytest.raises(SiteError, match="products.maps"):
        parse_site({**base, "products": {"maps": "elsewhere"}})
    with pytest.raises(SiteError, match="products.sums_interval_s"):
        parse_site({**base, "products": {"maps": "keep", "sums_interval_s": 0}})
    site = parse_site({**base, "products": {"maps": "keep", "store": "kept"}}, base_dir=tmp_path)
    assert site.products.store == (tmp_path / "kept").resolve() and parse_site(base).products.maps == "upload"
