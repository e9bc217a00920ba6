"""What the programs record about the software they ran with (result.json, plan headers, calibrations)."""
from __future__ import annotations

import platform
from importlib import metadata

import healpy as hp
import mpi4py
import numpy as np
import scipy
from mpi4py import MPI


def mapcampaign_version() -> str:
    """The installed mapcampaign's version, or "unknown" when running from a source tree alone."""
    try:
        return metadata.version("mapcampaign")
    except metadata.PackageNotFoundError:
        return "unknown"


def mpi_library() -> str:
    """The first line of the MPI library's version string (e.g. "MPICH Version: 4.2.0")."""
    return MPI.Get_library_version().splitlines()[0].strip()


def package_versions() -> dict[str, str]:
    """Versions of Python, the numerical packages, the MPI library and mapcampaign itself."""
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "healpy": hp.__version__,
        "mpi4py": mpi4py.__version__,
        "mpi": mpi_library(),
        "mapcampaign": mapcampaign_version(),
    }
