"""The bandpowers' mode couplings as the service records them: one row per (site, coupling key), written as
realisation results are accepted through the worker protocol, listed by ``GET /couplings`` and on the
dashboard's plans page, on SQLite and PostgreSQL.

The coupling file is a real one (pspy's coupling of an apodised nside-16 galactic cut, written by
``Coupling.write_npz``); the results carry its SHA-256 and size as the map-maker reports them: the first
realisation built it, the next ones read it.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import healpy as hp
import numpy as np
import pytest

import mapcampaign
from mapmaker.model import bandpowers as bp
from schemas.result import SPECTRA
from schemas.spec import CampaignSpec, coupling_key
from tests.api.test_dashboard import login
from tests.support.service_helpers import result_for, spec_data

NSIDE = 16
BIN_WIDTH = 8
HTML = {"Accept": "text/html"}


@pytest.fixture(scope="module")
def coupling_file(tmp_path_factory) -> dict:
    """A real coupling file, with the identity the map-maker reports for it."""
    npix = hp.nside2npix(NSIDE)
    sine_latitude = np.array(hp.pix2vec(NSIDE, np.arange(npix)))[2]
    hits = (np.abs(sine_latitude) > math.sin(math.radians(20.0))).astype(int)
    mask = bp.analysis_mask(hits, apodisation_deg=10.0)
    coupling = bp.build_coupling(mask, bp.Binning.for_nside(NSIDE, BIN_WIDTH), purify_b=False)
    path: Path = tmp_path_factory.mktemp("coupling") / "coupling.npz"
    coupling.write_npz(str(path))
    payload = path.read_bytes()
    return {
        "coupling": coupling,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "bytes": len(payload),
    }


def result_with_coupling(task: dict, coupling_file: dict, *, built: bool, sha256: str | None = None) -> dict:
    """A realisation's result whose bandpowers say how the coupling file came (``built`` or read)."""
    coupling = coupling_file["coupling"]
    binning = coupling.binning
    zeros = {name: [0.0] * len(binning.ell_lo) for name in SPECTRA}
    result = result_for(task["spec"], task["realization"])
    result["spectra"] = {
        "ell_min": [int(v) for v in binning.ell_lo],
        "ell_max": [int(v) for v in binning.ell_hi],
        "lmax": binning.lmax,
        "ell_bin_width": BIN_WIDTH,
        "cl": zeros,
        "w2": 0.5,
        "fsky": 0.6,
        "apodization_deg": 10.0,
        "min_hits": 1,
        "signal": True,
        "noise": True,
        "monopole_k": 0.0,
        "dipole_k": [0.0, 0.0, 0.0],
        "bandpowers": {
            "ell_lo": [int(v) for v in binning.ell_lo],
            "ell_hi": [int(v) for v in binning.ell_hi],
            "lmax": binning.lmax,
            "bin_width": BIN_WIDTH,
            "reliable": [bool(v) for v in binning.reliable_bins],
            "purify_b": False,
            "cb": zeros,
            "mask_sha256": coupling.mask_sha256,
            "coupling_source": "built" if built else "file",
            "coupling_build_s": 0.25 if built else None,
            "coupling_sha256": sha256 or coupling_file["sha256"],
            "coupling_bytes": coupling_file["bytes"],
            "bandpowers_s": 0.1,
        },
    }
    return result


def deliver_all(api, worker: int, coupling_file: dict, count: int, *, first_builds: bool) -> list[dict]:
    """Claim ``count`` realize tasks and report each succeeded through the worker API."""
    tasks = api.claim(worker, max_tasks=count)
    assert [task["kind"] for task in tasks] == ["realize"] * count, tasks
    for number, task in enumerate(tasks):
        result = result_with_coupling(task, coupling_file, built=first_builds and number == 0)
        answer = api.wpost(f"/tasks/{task['task_id']}/succeeded", json={"result": result})
        assert answer.status_code == 200, answer.text
    return tasks


def test_couplings_are_recorded_as_results_are_accepted_and_listed_to_their_owners(api, coupling_file):
    first = api.create(name="transfer", realizations=3)
    second = api.create(name="noise bias", realizations=2)  # same spec apart from the name: the same coupling
    bobs = api.create(token=api.bob, name="bob's", realizations=1)
    worker = api.register()
    api.build_plan(worker)
    deliver_all(api, worker, coupling_file, 3 + 2, first_builds=True)

    answer = api.get("/couplings")
    assert answer.status_code == 200, answer.text
    (coupling,) = answer.json()["items"]
    assert coupling["uses"] == 5  # every accepted realisation of both campaigns
    assert coupling["file_sha256"] == coupling_file["sha256"] and coupling["size_bytes"] == coupling_file["bytes"]
    assert coupling["mask_sha256"] == coupling_file["coupling"].mask_sha256
    assert coupling["build_time_s"] == pytest.approx(0.25) and coupling["built_at"] is not None
    assert coupling["site"] == "local" and coupling["scan_key"] == first["scan_key"]
    expected_key = coupling_key(CampaignSpec.model_validate(spec_data(name="transfer", realizations=3)))
    assert coupling["coupling_key"] == expected_key
    assert [c["id"] for c in coupling["campaigns"]] == [second["id"], first["id"]]

    # bob's campaign has not used it yet: nothing to list; once it has, he sees it, naming his own campaign only
    assert api.get("/couplings", api.bob).json()["items"] == []
    bob_worker = api.register(name="bw", token=api.bob_worker)
    (task,) = api.claim(bob_worker, max_tasks=1, token=api.bob_worker)
    result = result_with_coupling(task, coupling_file, built=False)
    assert api.wpost(f"/tasks/{task['task_id']}/succeeded", api.bob_worker, json={"result": result}).status_code == 200
    (seen,) = api.get("/couplings", api.bob).json()["items"]
    assert seen["uses"] == 6 and [c["name"] for c in seen["campaigns"]] == ["bob's"]
    assert seen["campaigns"][0]["id"] == bobs["id"]
    assert api.get("/couplings", params={"site": "elsewhere"}).json()["items"] == []

    # the public client reads the same listing
    with mapcampaign.Client(server="http://testserver", token=api.alice, transport=api.client._transport) as client:
        [listed] = client.couplings(site="local")
        assert listed.uses == 6 and listed.file_sha256 == coupling_file["sha256"]
        assert [c.id for c in listed.campaigns] == [second["id"], first["id"]]
        assert client.couplings(scan_key="0" * 64) == []


def test_a_differing_coupling_file_is_a_warning_event_not_a_failure(api, coupling_file):
    campaign = api.create(name="rebuilt", realizations=2)
    worker = api.register()
    api.build_plan(worker)
    tasks = api.claim(worker, max_tasks=2)
    first = result_with_coupling(tasks[0], coupling_file, built=True)
    assert api.wpost(f"/tasks/{tasks[0]['task_id']}/succeeded", json={"result": first}).status_code == 200
    other = "f" * 64
    second = result_with_coupling(tasks[1], coupling_file, built=True, sha256=other)
    assert api.wpost(f"/tasks/{tasks[1]['task_id']}/succeeded", json={"result": second}).status_code == 200

    (coupling,) = api.get("/couplings").json()["items"]
    assert coupling["uses"] == 2 and coupling["file_sha256"] == other  # the row follows the newest file
    events = api.get("/events/log", params={"campaign_id": campaign["id"]}).json()
    (warning,) = [event for event in events if event["kind"] == "coupling"]
    assert warning["state"] == "warning" and warning["realization"] == tasks[1]["realization"]
    assert warning["data"]["recorded_sha256"] == coupling_file["sha256"] and warning["data"]["reported_sha256"] == other


def test_a_result_without_a_coupling_file_records_nothing(api):
    api.create(realizations=1)
    worker = api.register()
    api.build_plan(worker)
    (task,) = api.claim(worker, max_tasks=1)
    assert api.succeed(task).status_code == 200
    assert api.get("/couplings").json()["items"] == []


def test_the_plans_page_lists_the_mode_couplings(api, coupling_file):
    campaign = api.create(name="masked", realizations=2)
    worker = api.register()
    api.build_plan(worker)
    login(api)
    assert 'id="couplings-empty"' in api.client.get("/plans", headers=HTML).text
    deliver_all(api, worker, coupling_file, 2, first_builds=True)
    text = api.client.get("/plans", headers=HTML).text
    assert "Mode couplings" in text and '<table class="plans" id="couplings">' in text
    (coupling,) = api.get("/couplings").json()["items"]
    row = text[text.index(f'data-coupling="{coupling["id"]}"') :]
    row = row[: row.index("</tr>")]
    assert coupling["coupling_key"][:12] in row and coupling_file["sha256"] in row
    assert '<td data-role="uses">2</td>' in row and '<td data-role="build-time">0.25 s</td>' in row
    assert '<td data-role="site">local</td>' in row and f'href="/campaigns/{campaign["id"]}"' in row
