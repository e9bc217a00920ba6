"""The site data folder: where a site keeps plans, products and the work folders of tasks.

::

    <site data>/                       default <MAPCAMPAIGN_DATA_DIR>/sites/<site name>/
        plans/<scan key[:16]>-r<ranks>-p<plan id>-b<build>.plan
        plans/<...>.report.json        the preprocess report beside its plan
        couplings/<coupling key[:32]>.npz   the bandpowers' mode coupling of a scan pattern and its products
                                       settings: written by the first realisation, read by the others
        coarse/<coarse key[:32]>.npz   the two-level preconditioner's coarse operator of a scan pattern, noise
                                       model and rank count: written by the first realisation, read by the others
        coarse/<...>.npz.timings/      preconditioner auto's timed solves with and without it, one JSON each
        campaigns/<id>/realizations/<n>/attempt-<k>/   products of attempt k (map-maker --out)
        work/<task id>/                spec, runner files, stdout/stderr of one task
        parsl/<worker name>/           Parsl's run folder (logs, submit scripts) and the local node file

The service keeps uploaded products under its own data folder
(``<MAPCAMPAIGN_DATA_DIR>/campaigns/...``); the default site folder is beside it
under ``sites/``, so the two never collide. Every attempt writes its own
product folder, and the map-maker creates it by renaming a hidden temporary
folder at the very end, so a killed attempt never leaves a folder that looks
complete and never touches another attempt's products.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from worker.site import SiteConfig


@dataclass(frozen=True)
class SiteLayout:
    root: Path

    @classmethod
    def for_site(cls, site: SiteConfig, data_dir: Path) -> SiteLayout:
        return cls((site.data_dir or data_dir / "sites" / site.name).resolve())

    @property
    def plans(self) -> Path:
        return self.root / "plans"

    @property
    def couplings(self) -> Path:
        return self.root / "couplings"

    def coupling_file(self, coupling_key: str) -> Path:
        return self.couplings / f"{coupling_key[:32]}.npz"

    @property
    def coarse(self) -> Path:
        return self.root / "coarse"

    def coarse_file(self, coarse_key: str) -> Path:
        return self.coarse / f"{coarse_key[:32]}.npz"

    @property
    def campaigns(self) -> Path:
        return self.root / "campaigns"

    @property
    def work(self) -> Path:
        return self.root / "work"

    def parsl_dir(self, worker_name: str) -> Path:
        return self.root / "parsl" / worker_name

    def plan_file(self, *, scan_key: str, ranks: int, plan_id: int, build: int) -> Path:
        return self.plans / f"{scan_key[:16]}-r{ranks}-p{plan_id}-b{build}.plan"

    def realization_dir(self, campaign_id: int, index: int) -> Path:
        return self.campaigns / str(campaign_id) / "realizations" / str(index)

    def product_dir(self, campaign_id: int, index: int, attempt: int) -> Path:
        return self.realization_dir(campaign_id, index) / f"attempt-{attempt}"

    def work_dir(self, task_id: str) -> Path:
        return self.work / task_id

    def create(self) -> None:
        for folder in (self.plans, self.couplings, self.coarse, self.campaigns, self.work):
            folder.mkdir(parents=True, exist_ok=True)


def remove_entry(path: Path) -> None:
    """Remove a file, a symbolic link or a whole folder (not what a link points to); a missing one is no error."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
