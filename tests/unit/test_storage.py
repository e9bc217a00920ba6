"""The campaign folder layout (pinned: stored data of an existing installation must still be found) and uploads."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from schemas.result import ProductFile
from service.storage import ArtifactRejected, ArtifactStore, CampaignProducts, CampaignStorage, ProductsMissing


def test_the_layout_under_the_campaigns_folder_is_the_one_installations_have_on_disk(tmp_path):
    root = tmp_path / "campaigns"
    storage = CampaignStorage(root)
    assert storage.realization_dir(3, 7) == root / "3/realizations/7"
    assert storage.product_path(3, 7, "map_iqu.fits") == root / "3/realizations/7/map_iqu.fits"
    assert storage.staging_root(3) == root / "3/realizations/.staging"
    assert storage.staging_dir(3, 12) == root / "3/realizations/.staging/attempt-12"
    assert storage.quicklook_image(3, 7, "0123456789abcdef" * 4, "Q") == root / "3/quicklook/7-0123456789abcdef-Q.png"

    files = CampaignProducts(root, 3)
    assert files.root == root / "3/products"
    assert files.state_path == root / "3/products/state.json"
    assert files.lock_path == root / "3/products/.lock"
    assert files.mask_path == root / "3/products/mask.fits"
    assert files.map_sums_path(12) == root / "3/products/mapsums-000000012.npz"
    assert files.cache_path(5, "spectra.fits") == root / "3/products/cache/g5-spectra.fits"
    assert files.realization_cache_path(7, "map.npz") == root / "3/products/realization-cache/r7-map.npz"
    assert files.realization_dir(7) == storage.realization_dir(3, 7)
    assert files.unreadable_state_path().name.startswith("state.json.unreadable-")


def test_cache_generation_reads_back_what_cache_path_wrote(tmp_path):
    files = CampaignProducts(tmp_path, 1)
    assert files.cache_generation(files.cache_path(42, "mean-I.png").name) == 42
    assert files.cache_generation("mean-I.png") is None
    assert files.cache_generation("gx-mean.png") is None


def test_deleting_a_campaign_removes_its_folder_and_no_other(tmp_path):
    storage = CampaignStorage(tmp_path)
    for campaign_id in (1, 2):
        storage.realization_dir(campaign_id, 0).mkdir(parents=True)
        (storage.realization_dir(campaign_id, 0) / "map.fits").write_bytes(b"map")
    storage.delete_campaign(1)
    storage.delete_campaign(99)  # nothing there: no error
    assert not storage.campaign_dir(1).exists()
    assert (storage.realization_dir(2, 0) / "map.fits").read_bytes() == b"map"


async def _chunks(payload: bytes):
    for start in range(0, len(payload), 3):
        yield payload[start : start + 3]


def _receive(store: ArtifactStore, name: str, payload: bytes, sha256: str | None = None) -> int:
    return asyncio.run(
        store.receive(
            _chunks(payload),
            campaign_id=1,
            attempt_id=5,
            name=name,
            sha256=sha256 or hashlib.sha256(payload).hexdigest(),
            max_bytes=1 << 20,
        )
    )


def _product(name: str, payload: bytes) -> ProductFile:
    return ProductFile(name="iqu", path=name, sha256=hashlib.sha256(payload).hexdigest(), size_bytes=len(payload))


def test_an_upload_replaced_by_another_counts_with_the_new_checksum_only(tmp_path):
    store = ArtifactStore(tmp_path)
    first, second = b"first map bytes", b"second, longer map bytes"
    assert _receive(store, "map.fits", first) == len(first)
    assert _receive(store, "map.fits", second) == len(second)
    store.check_products(campaign_id=1, attempt_id=5, products=[_product("map.fits", second)])
    with pytest.raises(ProductsMissing):
        store.check_products(campaign_id=1, attempt_id=5, products=[_product("map.fits", first)])

    store.publish(campaign_id=1, attempt_id=5, index=0, products=[_product("map.fits", second)])
    published = CampaignStorage(tmp_path).realization_dir(1, 0)
    assert sorted(path.name for path in published.iterdir()) == ["map.fits"]  # the note stays behind
    assert (published / "map.fits").read_bytes() == second


def test_an_upload_with_the_wrong_checksum_leaves_the_earlier_one_in_place(tmp_path):
    store = ArtifactStore(tmp_path)
    _receive(store, "map.fits", b"kept")
    with pytest.raises(ArtifactRejected):
        _receive(store, "map.fits", b"other", sha256="0" * 64)
    store.check_products(campaign_id=1, attempt_id=5, products=[_product("map.fits", b"kept")])
    staging = CampaignStorage(tmp_path).staging_dir(1, 5)
    assert sorted(path.name for path in Path(staging).iterdir()) == ["map.fits", "map.fits.sha256"]
