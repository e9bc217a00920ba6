"""Worker settings: MAPCAMPAIGN_* variables, defaults shared with the service, nonsense refused."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from service.config import default_data_dir as service_default_data_dir
from worker.settings import WorkerSettings, default_data_dir


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("MAPCAMPAIGN_"):
            monkeypatch.delenv(name)


def test_defaults_match_the_embedded_service(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    settings = WorkerSettings()
    assert default_data_dir() == service_default_data_dir() == tmp_path / "mapcampaign"
    assert settings.server == "http://127.0.0.1:8765" and settings.api_url == "http://127.0.0.1:8765/api/v1"
    assert settings.effective_token_file == tmp_path / "mapcampaign" / "tokens" / "local-worker.token"
    assert settings.worker_name("local").startswith("local@")
    assert settings.drain_s == 300 and settings.heartbeat_s is None and not settings.keep_work


def test_environment_and_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("MAPCAMPAIGN_SERVER", "http://svc:9000/api/v1/")
    monkeypatch.setenv("MAPCAMPAIGN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAPCAMPAIGN_WORKER_NAME", "w-7")
    monkeypatch.setenv("MAPCAMPAIGN_WORKER_DRAIN_S", "12.5")
    monkeypatch.setenv("MAPCAMPAIGN_WORKER_KEEP_WORK", "true")
    monkeypatch.setenv("MAPCAMPAIGN_SITE", "deploy/sites/local.toml")
    settings = WorkerSettings()
    assert settings.server == "http://svc:9000" and settings.worker_name("local") == "w-7"
    assert settings.drain_s == 12.5 and settings.keep_work and str(settings.site) == "deploy/sites/local.toml"
    assert WorkerSettings(name="cli-name", server="https://x.org").worker_name("s") == "cli-name"


@pytest.mark.parametrize(
    "variable, value",
    [("MAPCAMPAIGN_SERVER", "svc:9000"), ("MAPCAMPAIGN_WORKER_POLL_S", "0"), ("MAPCAMPAIGN_WORKER_NAME", "a b")],
)
def test_nonsense_is_refused(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError):
        WorkerSettings()
