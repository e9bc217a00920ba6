"""The tutorial notebook (docs/tutorials/first-campaign.ipynb) runs top to bottom, as a newcomer runs it:
against `mapcampaign up` (the service and a real local worker) on this machine, found with no arguments."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.cli.test_cli_up import assert_no_processes_left, wait_until
from tests.support.live_service import free_port, is_healthy, mapcampaign_command, service_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "first-campaign.ipynb"


def test_the_tutorial_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    env = service_env(data_dir, free_port(), None, None)
    up = subprocess.Popen(
        mapcampaign_command("up"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        wait_until(lambda: is_healthy(f"http://127.0.0.1:{env['MAPCAMPAIGN_PORT']}"), 120, "the API", up)
        wait_until((data_dir / "up" / "server.json").exists, 60, "up's address record", up)
        # The kernel inherits this environment: the data folder and nothing else, as on a user's machine
        # (the client reads the address of the running `up` and the token from there).
        for name in ("MAPCAMPAIGN_SERVER", "MAPCAMPAIGN_URL", "MAPCAMPAIGN_TOKEN", "MAPCAMPAIGN_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("MAPCAMPAIGN_DATA_DIR", str(data_dir))
        monkeypatch.delenv("MAPCAMPAIGN_PORT", raising=False)
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        NotebookClient(
            notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
        outputs = {
            index: "".join(output.get("text", "") for output in cell.get("outputs", []))
            for index, cell in enumerate(notebook.cells)
            if cell.cell_type == "code"
        }
        text = "\n".join(outputs.values())
        assert "pixelization.nside" in text  # the refused spec named its field
        assert "succeeded" in text and "2 realisations in the aggregates" in text
        images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        assert len(images) >= 2  # the map and the spectrum were drawn
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.communicate(timeout=180)
    assert_no_processes_left(data_dir)
