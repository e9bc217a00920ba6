"""Where the client (and the CLI) finds the service and the token: mapcampaign/_connection.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mapcampaign import _connection
from mapcampaign.errors import ConfigurationError
from service.config import Settings

CONNECTION_VARIABLES = (
    "MAPCAMPAIGN_SERVER",
    "MAPCAMPAIGN_URL",
    "MAPCAMPAIGN_HOST",
    "MAPCAMPAIGN_PORT",
    "MAPCAMPAIGN_DATA_DIR",
    "MAPCAMPAIGN_TOKEN",
    "MAPCAMPAIGN_TOKEN_FILE",
    "XDG_DATA_HOME",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No connection variables of the machine, and a home of the test's own."""
    for name in CONNECTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def write_up_record(data_dir: Path, url: str, pid: int) -> None:
    record = _connection.up_record_path(data_dir)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"url": url, "pid": pid}))


def exited_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize(
    "variables",
    [
        {},
        {"XDG_DATA_HOME": "xdg"},
        {"MAPCAMPAIGN_DATA_DIR": "data"},
        {"MAPCAMPAIGN_DATA_DIR": "~/elsewhere", "XDG_DATA_HOME": "xdg"},
    ],
)
def test_the_data_folder_is_the_service_s(variables, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert _connection.data_dir() == Settings().data_dir


def test_the_server_comes_from_the_argument_then_the_variables_then_up_then_host_and_port(monkeypatch, tmp_path):
    data_dir = tmp_path / "data"
    monkeypatch.setenv("MAPCAMPAIGN_DATA_DIR", str(data_dir))
    assert _connection.server_url() == "http://127.0.0.1:8765"
    monkeypatch.setenv("MAPCAMPAIGN_HOST", "0.0.0.0")
    monkeypatch.setenv("MAPCAMPAIGN_PORT", "9001")
    assert _connection.server_url() == "http://127.0.0.1:9001"
    write_up_record(data_dir, "http://127.0.0.1:9555", os.getpid())
    assert _connection.server_url() == "http://127.0.0.1:9555"
    monkeypatch.setenv("MAPCAMPAIGN_URL", "http://old.example:1/api/v1/")
    assert _connection.server_url() == "http://old.example:1"
    monkeypatch.setenv("MAPCAMPAIGN_SERVER", "https://new.example/")
    assert _connection.server_url() == "https://new.example"
    assert _connection.server_url("http://given.example:2") == "http://given.example:2"


def test_the_record_of_an_up_that_has_ended_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv("MAPCAMPAIGN_DATA_DIR", str(tmp_path))
    write_up_record(tmp_path, "http://127.0.0.1:9555", exited_pid())
    assert _connection.server_url() == "http://127.0.0.1:8765"


def test_an_ipv6_host_is_bracketed():
    assert _connection.local_server_url("::1", 80) == "http://[::1]:80"
    assert _connection.local_server_url("::", 80) == "http://127.0.0.1:80"


@pytest.mark.parametrize("port", ["http", "0", "70000"])
def test_a_bad_port_is_a_configuration_error(port, monkeypatch):
    monkeypatch.setenv("MAPCAMPAIGN_PORT", port)
    with pytest.raises(ConfigurationError, match="MAPCAMPAIGN_PORT"):
        _connection.server_url()


def test_a_server_without_a_scheme_is_refused():
    with pytest.raises(ConfigurationError, match="must start with http"):
        _connection.server_url("localhost:8765")


def test_the_token_comes_from_the_argument_then_the_variable_then_the_files(monkeypatch, tmp_path):
    data_dir = tmp_path / "data"
    monkeypatch.setenv("MAPCAMPAIGN_DATA_DIR", str(data_dir))
    (data_dir / "tokens").mkdir(parents=True)
    (data_dir / "tokens" / "local-user.token").write_text("from-data-dir\n")
    assert _connection.user_token() == "from-data-dir"
    token_file = tmp_path / "token"
    token_file.write_text(" from-file \n")
    monkeypatch.setenv("MAPCAMPAIGN_TOKEN_FILE", str(token_file))
    assert _connection.user_token() == "from-file"
    monkeypatch.setenv("MAPCAMPAIGN_TOKEN", "from-variable")
    assert _connection.user_token() == "from-variable"
    assert _connection.user_token("given") == "given"


def test_no_token_is_a_configuration_error_with_a_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("MAPCAMPAIGN_DATA_DIR", str(tmp_path))
    with pytest.raises(ConfigurationError, match="no API token: cannot read") as missing:
        _connection.user_token()
    assert missing.value.hint and "mapcampaign up" in missing.value.hint
    empty = tmp_path / "empty"
    empty.write_text("\n")
    monkeypatch.setenv("MAPCAMPAIGN_TOKEN_FILE", str(empty))
    with pytest.raises(ConfigurationError, match="is empty"):
        _connection.user_token()


def test_the_connection_module_and_the_package_import_only_the_standard_library():
    """The CLI reads its defaults from here on every start: importing them must not bring httpx or pydantic."""
    code = (
        "import sys, mapcampaign, mapcampaign._connection, mapcampaign.errors; "
        "print(sorted(name for name in ('httpx', 'pydantic', 'numpy', 'healpy', 'schemas') if name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
