"""Secrets kept out of the access log: uvicorn writes every request line, query string included.

A one-time login link (``/login/link?secret=mcl_...``) is opened with a GET, so its secret would be written
to ``serve.log`` (and to whatever collects it) while it is still valid. :class:`RedactSecrets`, installed
on the ``uvicorn.access`` logger by :func:`install_access_log_redaction` (``create_app`` calls it, in every
API process), replaces the value of every query parameter whose name says it is a secret, and every value
that looks like one of this service's tokens (``mcu_``, ``mcw_``, ``mcl_``), by ``[redacted]``.

A reverse proxy in front of the API keeps its own access log; see ``deploy/proxy``.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

ACCESS_LOGGER = "uvicorn.access"
REDACTED = "[redacted]"
SECRET_PARAMETERS = frozenset(
    {"secret", "token", "access_token", "api_key", "apikey", "key", "password", "csrf_token"}
)
TOKEN_VALUE = re.compile(r"mc[luw]_[A-Za-z0-9_\-]{8,}")


def redact_target(target: str) -> str:
    """A request target (path and query string) with its secrets replaced by ``[redacted]``."""
    path, mark, query = target.partition("?")
    path = TOKEN_VALUE.sub(REDACTED, path)
    if not mark:
        return path
    parts = []
    for part in query.split("&"):
        name, equals, value = part.partition("=")
        if not equals:  # a bare value, no name=
            parts.append(REDACTED if TOKEN_VALUE.search(unquote_plus(part)) else part)
        elif unquote_plus(name).strip().lower() in SECRET_PARAMETERS or TOKEN_VALUE.search(unquote_plus(value)):
            parts.append(f"{name}={REDACTED}")
        else:
            parts.append(part)
    return f"{path}?{'&'.join(parts)}"


class RedactSecrets(logging.Filter):
    """Rewrites uvicorn's access records: ``'%s - "%s %s HTTP/%s" %d'`` with the target third."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_target(args[2]), *args[3:])
        return True


def install_access_log_redaction() -> None:
    """Add :class:`RedactSecrets` to the ``uvicorn.access`` logger once per process."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(existing, RedactSecrets) for existing in logger.filters):
        logger.addFilter(RedactSecrets())
