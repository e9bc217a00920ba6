"""Every code block of the docs that reads a product runs, against real campaigns on a live service.

Five campaigns of one scan (signal+noise, signal-only, noise-only, 3 realisations each; and the pure-E and pure-B
signal-only pair of the E/B transfer matrix, 2 each, the fewest a Monte Carlo error needs) are mapped for real
(what ``python -m mapmaker realize`` runs, under ``mpiexec -n 2``: maps, masks, pseudo-spectra and bandpowers) and
delivered through the worker API, so each is finished with every product its kind has. Then, page by page in
document order, each block that reads a product runs in a folder of its own page, as a reader would run it
(the CLI on the PATH, the service and the token in the environment):

* ``sh`` blocks: their ``mapcampaign products`` and ``mapcampaign spectrum`` lines (loops included);
* ``python`` blocks that open a downloaded file or call the client for products, whole.

The docs name campaigns by example ids; ``CAMPAIGN_IDS`` says which kind each id stands for on each page, and
the test puts the real campaign's id in its place. ``data.fits``, the data map of the spectrum examples, is
one of the signal+noise campaign's realisation maps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.io import load_spec
from tests.support.live_service import REPO, LiveService, start_live_service
from tests.support.mapped_campaign import SPEC, deliver_all, map_realizations

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
READS_A_PRODUCT = re.compile(
    r"mapcampaign (products|spectrum)\b|read_map\(|np\.load\(|\.products\(|download_products\(|"
    r"bandpower_covariance\(|realization_map\(|client\.spectrum\(|transfer_matrix\("
)
# page -> {example id in the page: campaign kind}
CAMPAIGN_IDS = {
    "README.md": {2: "signal+noise"},
    "docs/tutorials/first-campaign-cli.md": {2: "signal+noise"},
    "docs/how-to/products.md": {
        3: "signal+noise", 4: "signal-only", 5: "noise-only", 6: "signal+noise", 7: "E-only", 8: "B-only"
    },
    "docs/reference/cli-conventions.md": {3: "signal+noise"},
    "docs/tutorials/first-campaign-python.md": {},
}
# What a page's python blocks find defined by its earlier steps (the Python tutorial submits its campaign)
PRELUDES = {
    "docs/tutorials/first-campaign-python.md": (
        "import mapcampaign\nclient = mapcampaign.Client()\ncampaign = client.get({signal+noise})\n"
    ),
}
# where a campaign id stands in a command or a call
ID_PLACES = re.compile(
    r"(?P<head>mapcampaign (?:products|spectrum|watch|status) |--(?:transfer|transfer-e|transfer-b|noise|covariance) |"
    r"\b(?:transfer|transfer_e|transfer_b|pure_e|pure_b|noise|covariance)=|"
    r"\.(?:products|download_products|bandpower_covariance|realization_map)\()"
    r"(?P<id>\d+)"
)
# a call that takes two campaigns: the pure-E and pure-B pair of the E/B transfer matrix
PAIR_PLACES = re.compile(r"(?P<head>\.transfer_matrix\()(?P<first>\d+), (?P<second>\d+)\)")
# campaign kind (or pure sky) -> realisations; the docs read realisation 2 of a signal+noise campaign
REALIZATIONS = {"signal+noise": 3, "signal-only": 3, "noise-only": 3, "E-only": 2, "B-only": 2}


def kind_spec(kind: str) -> str:
    """The spec of a campaign of ``kind``: a campaign kind, or "E-only"/"B-only" for a pure signal-only sky."""
    pure = kind in ("E-only", "B-only")
    spec = SPEC.replace('kind = "noise-only"', f'kind = "{"signal-only" if pure else kind}"').replace(
        "realizations = 6", f"realizations = {REALIZATIONS[kind]}"
    )
    if kind != "noise-only":
        sky = '[sky]\nkind = "cmb"\nfwhm_arcmin = 240.0' + (f'\npolarization = "{kind}"' if pure else "")
        spec = spec.replace('[sky]\nkind = "none"', sky)
    return spec


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveService, dict[str, int], Path]]:
    folder = tmp_path_factory.mktemp("docs-products")
    service = start_live_service(folder / "service")
    try:
        user = service.client(service.user_token)
        worker = service.client(service.worker_token)
        worker_id = worker.post("/workers", json={"name": "docs", "site": "local", "host": "h", "capacity": 8})
        worker_id = worker_id.json()["id"]
        ids = {}
        for kind, realizations in REALIZATIONS.items():
            spec_path = folder / kind / "spec.toml"
            spec_path.parent.mkdir(parents=True)
            spec_path.write_text(kind_spec(kind))
            maps = map_realizations(spec_path, folder / kind / "maps", list(range(realizations)))
            created = user.post("/campaigns", json=load_spec(spec_path).model_dump(mode="json"))
            assert created.status_code == 201, created.text
            ids[kind] = created.json()["id"]
            deliver_all(worker, worker_id, maps)
            assert user.get(f"/campaigns/{ids[kind]}").json()["state"] == "succeeded"
        (folder / "data.fits").write_bytes((folder / "signal+noise" / "maps" / "r0001" / "map_iqu.fits").read_bytes())
        user.close()
        worker.close()
        yield service, ids, folder / "data.fits"
    finally:
        service.stop()


def product_blocks(page: str) -> list[tuple[str, str]]:
    """(language, body) of the page's sh and python blocks that read a product, in document order."""
    blocks = []
    for match in FENCE.finditer((REPO / page).read_text()):
        language = match["info"].strip().split()[:1]
        if language in (["sh"], ["python"]) and READS_A_PRODUCT.search(match["body"]):
            blocks.append((language[0], match["body"]))
    return blocks


def with_real_ids(text: str, page: str, ids: dict[str, int]) -> str:
    examples = CAMPAIGN_IDS[page]

    def replace(match: re.Match[str]) -> str:
        example = int(match["id"])
        assert example in examples, f"{page}: campaign {example} in {match[0]!r} is not in CAMPAIGN_IDS"
        return f"{match['head']}{ids[examples[example]]}"

    def replace_pair(match: re.Match[str]) -> str:
        first, second = (int(match[name]) for name in ("first", "second"))
        assert {first, second} <= set(examples), f"{page}: {match[0]!r} names a campaign not in CAMPAIGN_IDS"
        return f"{match['head']}{ids[examples[first]]}, {ids[examples[second]]})"

    return PAIR_PLACES.sub(replace_pair, ID_PLACES.sub(replace, text))


def shell_commands(body: str) -> list[str]:
    """The lines of an sh block that read a product (comments dropped)."""
    commands = []
    for line in body.splitlines():
        command = line.split("  #", 1)[0].strip()
        if command and not command.startswith("#") and READS_A_PRODUCT.search(command):
            commands.append(command)
    return commands


def test_every_page_with_a_block_that_reads_a_product_is_run():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    reading = {str(page.relative_to(REPO)) for page in pages if product_blocks(str(page.relative_to(REPO)))}
    assert reading == set(CAMPAIGN_IDS)


@pytest.mark.parametrize("page", sorted(CAMPAIGN_IDS))
def test_the_product_blocks_of_the_docs_run(campaigns, page, tmp_path):
    service, ids, data_map = campaigns
    blocks = product_blocks(page)
    assert blocks, f"{page} has no block that reads a product"
    (tmp_path / "data.fits").write_bytes(data_map.read_bytes())
    env = {
        **service.env,
        "MAPCAMPAIGN_SERVER": service.url,
        "MAPCAMPAIGN_TOKEN": service.user_token,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "MPLBACKEND": "Agg",
    }
    ran = 0
    for language, body in blocks:
        body = with_real_ids(body, page, ids)
        if language == "python":
            prelude = PRELUDES.get(page, "").replace("{signal+noise}", str(ids["signal+noise"]))
            commands = [[sys.executable, "-c", prelude + body]]
        else:
            commands = [["bash", "-c", command] for command in shell_commands(body)]
        for command in commands:
            done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
            assert done.returncode == 0, f"{page}:\n{command[-1]}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            ran += 1
    assert ran >= len(blocks)
