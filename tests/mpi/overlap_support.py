"""What the overlap MPI tests share: a small spec and the ``preprocess`` command."""
from mpi_support import SMALL_SATELLITE_SPEC, run_ranks

SPEC = SMALL_SATELLITE_SPEC


def write_spec(folder, name="spec.toml", **replace):
    text = SPEC
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = folder / name
    path.write_text(text)
    return path


def preprocess(ranks, spec, out, *extra):
    return run_ranks(ranks, "-m", "mapmaker", "preprocess", "--spec", str(spec), "--out", str(out), *extra, timeout=120)
