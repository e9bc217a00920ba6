"""The access log keeps no secrets: uvicorn's request lines pass through ``service.access_log.RedactSecrets``,
which ``create_app`` installs on the ``uvicorn.access`` logger."""

from __future__ import annotations

import logging

import pytest

from service.access_log import ACCESS_LOGGER, RedactSecrets, redact_target
from service.app import create_app
from service.config import Settings

SECRET = "mcl_" + "Zq3" * 14


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        (f"/login/link?secret={SECRET}", "/login/link?secret=[redacted]"),
        ("/api/v1/campaigns?state=running&token=abc&limit=5", "/api/v1/campaigns?state=running&token=[redacted]&limit=5"),
        ("/x?Access_Token=abc", "/x?Access_Token=[redacted]"),
        ("/x?%73ecret=abc", "/x?%73ecret=[redacted]"),  # a name spelled in percent escapes is still read as one
        ("/x?next=/campaigns/mcu_aaaaaaaaaaaa", "/x?next=[redacted]"),  # a token under any name
        (f"/x?{SECRET}", "/x?[redacted]"),
        ("/x/mcw_bbbbbbbbbbbbbbbb/y", "/x/[redacted]/y"),
        ("/api/v1/plans?scan_key=abc&site=nersc", "/api/v1/plans?scan_key=abc&site=nersc"),  # nothing secret
        ("/healthz", "/healthz"),
    ],
)
def test_secret_query_values_are_redacted(target: str, logged: str) -> None:
    assert redact_target(target) == logged


def test_the_app_installs_the_filter_on_uvicorns_access_logger(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    for existing in [f for f in logger.filters if isinstance(f, RedactSecrets)]:
        logger.removeFilter(existing)
    create_app(Settings(data_dir=tmp_path))
    create_app(Settings(data_dir=tmp_path))  # a second app in the same process adds no second filter
    assert sum(isinstance(f, RedactSecrets) for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        # The call uvicorn's HTTP protocols make for each response (uvicorn/protocols/http/*_impl.py).
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:50000", "GET", f"/login/link?secret={SECRET}", "1.1", 200)
    (record,) = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    assert record.getMessage() == '127.0.0.1:50000 - "GET /login/link?secret=[redacted] HTTP/1.1" 200'
    assert SECRET not in caplog.text
