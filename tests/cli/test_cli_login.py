"""``mapcampaign login``: a new one-time dashboard link from the running service, which keeps running."""

from __future__ import annotations

import re

import httpx

from tests.cli.conftest import run_cli, stdout_json
from tests.support.live_service import free_port, service_env


def test_login_prints_a_new_link_while_the_service_keeps_running(cli_service, fresh_user):
    plain = run_cli(fresh_user, "login")
    assert plain.returncode == 0, plain.stderr
    (first,) = plain.stdout.splitlines()  # only the link on stdout, for `xdg-open "$(mapcampaign login)"`
    assert first.startswith(f"{cli_service.url}/login/link?secret=mcl_")
    assert "open it in a browser and confirm" in plain.stderr

    as_json = run_cli(fresh_user, "login", "--json")
    assert as_json.returncode == 0, as_json.stderr
    second = stdout_json(as_json)
    assert set(second) == {"url", "expires_at"} and second["url"] != first

    # Both links are live (making one spends none), each shows the confirmation page of this user, and the
    # service that made them is the one that was running: no restart.
    for link in (first, second["url"]):
        page = httpx.get(link, timeout=30)
        assert page.status_code == 200, page.text
        name = re.search(r'<span id="link-user">([^<]+)</span>', page.text).group(1)
        assert re.fullmatch(r"u\d+", name) and f"Log in as {name}" in page.text  # the fixture names users u<digits>
        assert "mapcampaign_session" not in page.cookies
    assert cli_service.process.poll() is None


def test_login_with_no_service_running_says_so(tmp_path):
    env = service_env(tmp_path / "data", free_port(), None, None)  # nothing listens on this port
    env["MAPCAMPAIGN_TOKEN"] = "mcu_" + "x" * 43
    done = run_cli(env, "login")
    assert done.returncode == 1 and not done.stdout
    assert f"cannot reach the service at http://127.0.0.1:{env['MAPCAMPAIGN_PORT']}" in done.stderr
    assert "mapcampaign up" in done.stderr  # the hint says how to start one

    no_token = {key: value for key, value in env.items() if key != "MAPCAMPAIGN_TOKEN"}
    done = run_cli(no_token, "login")
    assert done.returncode == 2 and "no API token" in done.stderr
