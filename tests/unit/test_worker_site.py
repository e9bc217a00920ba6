"""Site files: the bundled ones load, bad ones are refused naming the field, and the CLI exits 2 on them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from worker.layout import SiteLayout
from worker.site import SiteError, load_site, parse_site

REPO = Path(__file__).resolve().parents[2]
SITES = REPO / "deploy" / "sites"


@pytest.mark.parametrize(
    "name, kind, launcher",
    [
        ("local", "local", "mpiexec"),
        ("slurm", "slurm", "srun"),
        ("slurm-mpiexec", "slurm", "mpiexec"),
        ("pbs", "pbspro", "mpiexec"),
    ],
)
def test_bundled_site_files_load(name, kind, launcher):
    site = load_site(SITES / f"{name}.toml")
    assert site.provider.kind == kind and site.mpi.launcher == launcher
    assert site.max_tasks <= site.tasks_per_block * site.provider.max_blocks


def test_local_defaults_and_relative_paths(tmp_path):
    (tmp_path / "site.toml").write_text(
        'name = "laptop"\ndata_dir = "sitedata"\nsky_root = "~/skies"\n[provider]\nkind = "local"\n'
    )
    site = load_site(tmp_path / "site.toml")
    assert site.data_dir == (tmp_path / "sitedata").resolve()
    assert site.sky_root == (Path.home() / "skies").resolve()
    assert site.max_tasks == 1 and site.tasks_per_block == 1 and site.nodes_per_block == 1
    assert site.runner.kill_grace_s == 10 and site.runner.liveness_timeout_s == 120
    assert SiteLayout.for_site(site, tmp_path / "other").root == (tmp_path / "sitedata").resolve()


def test_default_site_data_is_beside_the_service_data_not_inside_its_products(tmp_path):
    site = parse_site({"name": "local", "provider": {"kind": "local"}})
    layout = SiteLayout.for_site(site, tmp_path)
    assert layout.root == tmp_path / "sites" / "local"
    # The embedded service keeps uploaded products in <data dir>/campaigns/<id>/realizations/<n>/.
    assert not layout.product_dir(1, 0, 1).is_relative_to(tmp_path / "campaigns")
    assert layout.product_dir(3, 7, 2) == tmp_path / "sites/local/campaigns/3/realizations/7/attempt-2"
    assert layout.plan_file(scan_key="ab" * 32, ranks=4, plan_id=5, build=2).name == "abababababababab-r4-p5-b2.plan"


@pytest.mark.parametrize(
    "data, field, words",
    [
        ({"provider": {"kind": "local"}}, "name", "Field required"),
        ({"name": "bad name", "provider": {"kind": "local"}}, "name", "pattern"),
        ({"name": "x", "provider": {"kind": "lsf"}}, "provider", "does not match"),
        ({"name": "x", "provider": {"kind": "slurm", "walltime": "1h"}}, "provider.walltime", "HH:MM:SS"),
        ({"name": "x", "provider": {"kind": "slurm", "partiton": "debug"}}, "provider.partiton", "Extra inputs"),
        ({"name": "x", "provider": {"kind": "local", "max_blocks": 2}}, "provider.max_blocks", "less than or equal"),
        ({"name": "x", "provider": {"kind": "local"}, "mpi": {"launcher": "srun"}}, "(file)", "srun"),
        ({"name": "x", "provider": {"kind": "local"}, "mpi": {"launcher": "aprun"}}, "mpi.launcher", "mpiexec"),
        (
            {"name": "x", "max_tasks": 3, "provider": {"kind": "local"}, "executor": {"tasks_per_block": 2}},
            "(file)",
            "max_tasks",
        ),
        ({"name": "x", "max_tasks": 2, "provider": {"kind": "slurm", "nodes_per_block": 1}}, "(file)", "max_tasks"),
        ({"name": "x", "provider": {"kind": "local"}, "runner": {"kill_grace_s": 0}}, "runner.kill_grace_s", "greater"),
        (
            {
                "name": "x",
                "provider": {"kind": "local"},
                "executor": {"heartbeat_period_s": 60, "heartbeat_threshold_s": 30},
            },
            "executor",
            "heartbeat_threshold_s",
        ),
    ],
)
def test_bad_site_files_name_the_field(data, field, words):
    with pytest.raises(SiteError) as raised:
        parse_site(data, source="bad.toml")
    message = str(raised.value)
    assert message.startswith("bad.toml: invalid site")
    assert f"  {field}:" in message and words in message, message


def test_unreadable_site_files(tmp_path):
    with pytest.raises(SiteError, match="no such site file"):
        load_site(tmp_path / "missing.toml")
    (tmp_path / "broken.toml").write_text("name = \n")
    with pytest.raises(SiteError, match="not valid TOML"):
        load_site(tmp_path / "broken.toml")


def test_cli_refuses_a_bad_site_file_with_exit_2(tmp_path):
    bad = tmp_path / "site.toml"
    bad.write_text('name = "x"\n[provider]\nkind = "slurm"\nwalltime = "soon"\n')
    command = [sys.executable, "-c", "from mapcampaign.cli import main; main()", "worker", "--site", str(bad)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert done.returncode == 2, done.stderr
    assert "provider.walltime" in done.stderr and "HH:MM:SS" in done.stderr
    missing_token = tmp_path / "ok.toml"
    missing_token.write_text('name = "x"\n[provider]\nkind = "local"\n')
    done = subprocess.run(
        command[:-1] + [str(missing_token), "--token-file", str(tmp_path / "none.token")],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "worker token file" in done.stderr and "token create" in done.stderr


def test_executor_network_options():
    site = parse_site(
        {
            "name": "x",
            "provider": {"kind": "slurm"},
            "executor": {"address": "10.0.0.5", "worker_port_range": [54000, 54100], "encrypted": True},
        }
    )
    assert site.executor.worker_port_range == (54000, 54100) and site.executor.address == "10.0.0.5"
    with pytest.raises(SiteError, match="worker_port_range"):
        parse_site({"name": "x", "provider": {"kind": "slurm"}, "executor": {"worker_port_range": [60000, 50000]}})
