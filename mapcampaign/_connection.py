"""Where the service is and which token to use, the same for the Python client and the CLI.

First found wins:

* the service: the explicit argument (``--server``), ``MAPCAMPAIGN_SERVER``, ``MAPCAMPAIGN_URL`` (older
  name), the address of a running ``mapcampaign up`` on the same data folder, else
  ``http://MAPCAMPAIGN_HOST:MAPCAMPAIGN_PORT``;
* the user token: the explicit argument (``--token``), ``MAPCAMPAIGN_TOKEN``, the file
  ``MAPCAMPAIGN_TOKEN_FILE``, else ``<data dir>/tokens/local-user.token`` (written by ``up``, ``demo`` and
  ``serve`` on the embedded default).

The data folder is ``MAPCAMPAIGN_DATA_DIR``, else ``$XDG_DATA_HOME/mapcampaign`` or
``~/.local/share/mapcampaign``, as ``service.config.Settings`` computes it (a unit test checks they agree).
Standard library only: ``mapcampaign --help`` and ``import mapcampaign`` read this module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mapcampaign.errors import ConfigurationError

API_PREFIX = "/api/v1"  # schemas.api.API_PREFIX, repeated so that this module needs no pydantic
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOCAL_USER_TOKEN = "local-user.token"


def data_dir() -> Path:
    """The service's data folder on this machine (absolute)."""
    configured = os.environ.get("MAPCAMPAIGN_DATA_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(base).expanduser() / "mapcampaign").resolve()


def local_server_url(host: str, port: int) -> str:
    # A service listening on every interface is reached on the loopback.
    reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in reachable and not reachable.startswith("["):
        reachable = f"[{reachable}]"
    return f"http://{reachable}:{port}"


def up_record_path(folder: Path) -> Path:
    """Where ``mapcampaign up`` notes its URL and pid while it runs (so ``up --port P`` needs no --server later)."""
    return folder / "up" / "server.json"


def running_up_url(folder: Path) -> str | None:
    """The URL of the ``up`` running on this data folder, or None (no record, or its process is gone)."""
    try:
        record = json.loads(up_record_path(folder).read_text())
        os.kill(int(record["pid"]), 0)
        return str(record["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def configured_port() -> int:
    raw = os.environ.get("MAPCAMPAIGN_PORT", "").strip()
    if not raw:
        return DEFAULT_PORT
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65_535:
        raise ConfigurationError(f"bad settings: MAPCAMPAIGN_PORT: {raw!r} is not a port number (1 to 65535)")
    return port


def server_url(explicit: str | None = None) -> str:
    """The service's root URL (no trailing slash, no API prefix)."""
    url = explicit or os.environ.get("MAPCAMPAIGN_SERVER") or os.environ.get("MAPCAMPAIGN_URL")
    if not url:
        host = os.environ.get("MAPCAMPAIGN_HOST", "").strip() or DEFAULT_HOST
        url = running_up_url(data_dir()) or local_server_url(host, configured_port())
    url = url.strip().rstrip("/").removesuffix(API_PREFIX)
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"--server {url!r}: must start with http:// or https://")
    return url


def user_token(explicit: str | None = None, token_file: Path | None = None) -> str:
    """The user's API token."""
    token = explicit or os.environ.get("MAPCAMPAIGN_TOKEN", "")
    if token.strip():
        return token.strip()
    if token_file is None and os.environ.get("MAPCAMPAIGN_TOKEN_FILE"):
        token_file = Path(os.environ["MAPCAMPAIGN_TOKEN_FILE"])
    path = token_file or data_dir() / "tokens" / LOCAL_USER_TOKEN
    try:
        token = path.read_text().strip()
    except OSError as error:
        raise ConfigurationError(
            f"no API token: cannot read {path} ({error.strerror})",
            hint="start the service with `mapcampaign up`, or pass --token / set MAPCAMPAIGN_TOKEN "
            "to a user token (`mapcampaign token create --user NAME`)",
        ) from None
    if not token:
        raise ConfigurationError(f"no API token: {path} is empty")
    return token
