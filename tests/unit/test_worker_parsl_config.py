"""Site -> Parsl Config: one MPIExecutor on the site's provider with SimpleLauncher; nothing started."""

from __future__ import annotations

from pathlib import Path

from parsl.config import Config
from parsl.executors import MPIExecutor
from parsl.launchers import SimpleLauncher
from parsl.providers import LocalProvider, PBSProProvider, SlurmProvider

from worker.parsl_config import SlurmBlockProvider, build_parsl_config, local_nodefile_text
from worker.site import load_site, parse_site

SITES = Path(__file__).resolve().parents[2] / "deploy" / "sites"
PYTHON = "/opt/venv/bin/python"


def _executor(config: Config) -> MPIExecutor:
    assert isinstance(config, Config) and len(config.executors) == 1
    executor = config.executors[0]
    assert isinstance(executor, MPIExecutor) and executor.label == "mpi"
    assert isinstance(executor.provider.launcher, SimpleLauncher)
    assert executor.interchange_launch_cmd == [PYTHON, "-m", "worker.pdeathsig", "interchange.py"]
    return executor


def test_local_site_gets_a_node_file_and_the_environment_on_path(tmp_path):
    site = load_site(SITES / "local.toml")
    nodefile = tmp_path / "nodefile"
    config = build_parsl_config(site, run_dir=tmp_path / "run", python=PYTHON, nodefile=nodefile)
    executor = _executor(config)
    provider = executor.provider
    assert isinstance(provider, LocalProvider)
    assert (provider.init_blocks, provider.min_blocks, provider.max_blocks, provider.nodes_per_block) == (1, 1, 1, 1)
    assert executor.mpi_launcher == "mpiexec" and executor.max_workers_per_block == site.max_tasks == 2
    lines = provider.worker_init.splitlines()
    assert lines[0] == 'export PATH=/opt/venv/bin:"$PATH"'
    assert f"export PBS_NODEFILE={nodefile}" in lines and "unset SLURM_NODELIST SLURM_JOB_NODELIST" in lines
    assert config.retries == 0 and config.run_dir == str(tmp_path / "run")
    assert not nodefile.exists()  # pure: nothing written
    assert local_nodefile_text("vm", 3) == "vm\nvm\nvm\n"


def test_site_worker_init_comes_last(tmp_path):
    site = parse_site({"name": "x", "provider": {"kind": "local", "worker_init": "module load mpich"}})
    provider = build_parsl_config(site, run_dir=tmp_path, python=PYTHON, nodefile=tmp_path / "n").executors[0].provider
    assert provider.worker_init.splitlines()[-1] == "module load mpich"


def test_slurm_site(tmp_path):
    site = load_site(SITES / "slurm.toml")
    executor = _executor(build_parsl_config(site, run_dir=tmp_path, python=PYTHON, nodefile=None))
    provider = executor.provider
    assert isinstance(provider, SlurmProvider)
    assert provider.partition == "debug" and provider.exclusive and provider.nodes_per_block == 1
    assert (provider.init_blocks, provider.min_blocks, provider.max_blocks) == (0, 0, 1)
    assert provider.walltime == "01:00:00"
    assert executor.mpi_launcher == "srun" and executor.max_workers_per_block == 1
    assert "PBS_NODEFILE" not in provider.worker_init


def test_slurm_options_pass_through(tmp_path):
    site = parse_site(
        {
            "name": "perlmutter",
            "max_tasks": 4,
            "provider": {
                "kind": "slurm", "partition": "regular", "account": "m1", "qos": "debug", "constraint": "cpu",
                "nodes_per_block": 4, "max_blocks": 2, "walltime": "0-02:00:00", "scheduler_options": "#SBATCH -L scratch",
                "mem_per_node_gb": 200, "cores_per_node": 128,
            },
            "executor": {"heartbeat_period_s": 10, "heartbeat_threshold_s": 40},
        }
    )  # fmt: skip
    executor = build_parsl_config(site, run_dir=tmp_path, python=PYTHON, nodefile=None).executors[0]
    provider = executor.provider
    assert (provider.account, provider.qos, provider.constraint) == ("m1", "debug", "cpu")
    assert provider.mem_per_node == 200 and provider.cores_per_node == 128 and provider.max_blocks == 2
    assert executor.max_workers_per_block == 4 and executor.heartbeat_threshold == 40


def test_pbs_site(tmp_path):
    site = load_site(SITES / "pbs.toml")
    executor = _executor(build_parsl_config(site, run_dir=tmp_path, python=PYTHON, nodefile=None))
    provider = executor.provider
    assert isinstance(provider, PBSProProvider)
    assert provider.queue == "debug" and provider.nodes_per_block == 2 and provider.cpus_per_node == 64
    assert provider.select_options == "mpiprocs=64" and executor.mpi_launcher == "mpiexec"
    assert executor.max_workers_per_block == 2


def test_network_options_reach_the_executor_and_slurm_blocks_survive_purged_jobs(tmp_path):
    site = parse_site(
        {
            "name": "x",
            "provider": {"kind": "slurm"},
            "executor": {"address": "10.0.0.5", "worker_port_range": [54000, 54100], "encrypted": True},
        }
    )
    executor = _executor(build_parsl_config(site, run_dir=tmp_path, python=PYTHON, nodefile=None))
    assert executor.address == "10.0.0.5" and executor.worker_port_range == (54000, 54100) and executor.encrypted
    assert isinstance(executor.provider, SlurmBlockProvider)
