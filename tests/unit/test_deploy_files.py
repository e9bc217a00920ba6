"""The deployment files as files: compose, Dockerfile, systemd units and environment files, proxy configs,
site files. Docker cannot run here, so the compose file is checked for structure, not started."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

import pytest
import yaml

from service.config import Settings
from worker.settings import WorkerSettings
from worker.site import load_site

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def env_names(model: type) -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        names.add(alias if isinstance(alias, str) else f"MAPCAMPAIGN_{name.upper()}")
    return names


def test_compose_has_database_api_and_worker_wired_together():
    services = compose()["services"]
    assert set(services) == {"db", "migrate", "api", "token", "worker"}
    assert services["db"]["image"].startswith("postgres:")
    database_url = services["api"]["environment"]["MAPCAMPAIGN_DATABASE_URL"]
    assert database_url.startswith("postgresql://") and "@db:5432/" in database_url
    assert services["migrate"]["command"] == ["mapcampaign", "db", "upgrade"]
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert services["api"]["command"][:2] == ["mapcampaign", "serve"]
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["api"]["ports"] == ["127.0.0.1:8765:8765"]  # loopback: the TLS proxy is the way in
    worker = services["worker"]
    assert worker["command"][:3] == ["mapcampaign", "worker", "--site"]
    assert worker["command"][3] == "/opt/mapcampaign/deploy/sites/local.toml"
    assert worker["environment"]["MAPCAMPAIGN_SERVER"] == "http://api:8765"
    assert worker["depends_on"]["api"]["condition"] == "service_healthy"
    for name, service in services.items():  # every MAPCAMPAIGN_* variable is one the programs read
        for variable in service.get("environment", {}):
            if variable.startswith("MAPCAMPAIGN_"):
                assert variable in env_names(Settings) | env_names(WorkerSettings), (name, variable)
    named_volumes = set(compose()["volumes"])
    for service in services.values():
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in named_volumes


def test_dockerfile_copies_what_exists_and_serves():
    text = (DEPLOY / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (\S+)", text, flags=re.MULTILINE):
        assert (REPO / source).exists(), source
    assert 'CMD ["mapcampaign", "serve"]' in text
    assert compose()["services"]["api"]["build"]["dockerfile"] == "deploy/Dockerfile"


@pytest.mark.parametrize(
    "unit, env_file, model",
    [("mapcampaign-api.service", "api.env", Settings), ("mapcampaign-worker.service", "worker.env", WorkerSettings)],
)
def test_systemd_units_and_environment_files(unit, env_file, model):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(DEPLOY / "systemd" / unit)
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    assert parser["Service"]["ExecStart"].split()[0].endswith("/.venv/bin/mapcampaign")
    assert parser["Service"]["EnvironmentFile"].endswith(env_file)
    variables = {}
    for line in (DEPLOY / "systemd" / env_file).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            variables[key] = value
    assert set(variables) <= env_names(model), set(variables) - env_names(model)
    if model is WorkerSettings:
        assert variables["MAPCAMPAIGN_SERVER"].startswith("https://")  # through the TLS proxy
        assert WorkerSettings(server=variables["MAPCAMPAIGN_SERVER"]).api_url.startswith("https://")


def test_proxy_configs_forward_headers_and_do_not_buffer_events():
    nginx = (DEPLOY / "proxy" / "nginx.conf").read_text()
    assert "X-Forwarded-Proto" in nginx and "X-Forwarded-For" in nginx
    events = nginx[nginx.index("location /api/v1/events") :]
    assert "proxy_buffering off" in events
    assert "reverse_proxy 127.0.0.1:8765" in (DEPLOY / "proxy" / "Caddyfile").read_text()


def test_proxies_close_idle_upstream_connections_before_the_api_does():
    """The side that closes an idle connection first must be the one that sends on it: the proxy."""
    api_s = Settings.model_fields["keep_alive_s"].default
    nginx = re.search(r"keepalive_timeout (\d+)s;", (DEPLOY / "proxy" / "nginx.conf").read_text())
    caddy = re.search(r"keepalive (\d+)s", (DEPLOY / "proxy" / "Caddyfile").read_text())
    assert nginx and caddy
    assert int(nginx.group(1)) < api_s and int(caddy.group(1)) < api_s


def test_every_bundled_site_file_loads():
    sites = sorted((DEPLOY / "sites").glob("*.toml"))
    assert {site.stem for site in sites} >= {"local", "slurm", "slurm-mpiexec", "pbs"}
    for path in sites:
        load_site(path)


SERVER_MODULES = {"fastapi", "uvicorn", "starlette", "http.server", "socketserver", "service", "sqlalchemy"}


def test_the_worker_is_only_a_client_of_the_service():
    """The service never connects to a worker: no server code in worker/ (Parsl's interchange aside)."""
    for path in (REPO / "worker").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert not any(module == bad or module.startswith(bad + ".") for bad in SERVER_MODULES), (path, module)


def test_ci_installs_slurm():
    text = (REPO / "scripts" / "install-system-deps").read_text()
    packages = re.search(r"APT_PACKAGES=\(([^)]*)\)", text).group(1).split()
    assert {"slurm-wlm", "munge"} <= set(packages)
