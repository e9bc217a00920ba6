"""``import mapcampaign`` and ``mapcampaign --help`` stay light: what they load is read from ``sys.modules``
in a fresh interpreter (not timed: a loaded machine would make a time limit flaky, a module count is not).

The heavy parts (healpy with numpy, SQLAlchemy, FastAPI, Parsl, mpi4py) load only when a command or a
client method needs them. `python -X importtime -c "import mapcampaign"` shows where the time goes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "healpy", "sqlalchemy", "fastapi", "starlette", "parsl", "mpi4py", "pydantic", "httpx", "service", "worker")
# A command's own --help goes through Typer's parameter adapters, which import pydantic (Typer's doing).
HEAVY_FOR_HELP = tuple(name for name in HEAVY if name != "pydantic")

PROBE = """
import json, sys
{body}
print(json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)))
"""

HELP = """
from mapcampaign.cli import app
try:
    app({args!r}, prog_name="mapcampaign")
except SystemExit as done:
    assert done.code in (0, None), done.code
"""


def loaded_after(body: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body, heavy=heavy)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_mapcampaign_loads_nothing_heavy():
    assert loaded_after("import mapcampaign, mapcampaign.errors") == []


@pytest.mark.parametrize("args", [["--help"], ["submit", "--help"], ["extend", "--help"], ["up", "--help"]])
def test_help_loads_nothing_heavy(args):
    assert loaded_after(HELP.format(args=args), HEAVY_FOR_HELP) == []


def test_the_top_level_help_loads_not_even_pydantic():
    assert loaded_after(HELP.format(args=["--help"])) == []


def test_the_probe_sees_a_heavy_import():
    """The check is not vacuous: naming the client class does bring httpx and pydantic."""
    assert {"httpx", "pydantic"} <= set(loaded_after("import mapcampaign; mapcampaign.Client"))
