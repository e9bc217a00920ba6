"""Run under mpiexec with a plan of this rank count: load_plan refuses damaged copies, on every rank at once.

argv: PLAN REPORT.json FOLDER. Each damage is written by rank 0 into FOLDER,
then every rank must get PlanRefused with the expected words (one verdict
for all ranks, whichever rank found the damage). Prints "refusal checks
passed on N ranks" from rank 0.
"""
import sys
from pathlib import Path

from mpi4py import MPI

from mapmaker.parallel.planfile import ENTRY, HEADER, PlanIdentity, PlanRefused, load_plan
from schemas.plan import PlanReport


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x40]) + data[position + 1 :]


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    plan_path, report_path, folder = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    report = PlanReport.model_validate_json(report_path.read_text())
    identity = PlanIdentity(report.scan_key, report.ranks, report.decomposition)
    data = plan_path.read_bytes()
    fields = HEADER.unpack_from(data, 0)
    table_offset, json_offset, data_offset = fields[3], fields[4], fields[6]

    def section_byte(r: int) -> int:
        offset, length, _ = ENTRY.unpack_from(data, table_offset + r * ENTRY.size)
        return data_offset + offset + length // 3

    damages = {
        "header JSON": (flip(data, json_offset + 7), "header checksum mismatch"),
        "table entry": (flip(data, table_offset + (size - 1) * ENTRY.size + 20), "index table checksum mismatch"),
        "padding": (data + b"\0" * 64, "truncated or padded"),
        "magic": (b"XXXX" + data[4:], "not an overlap plan"),
        "version": (data[:8] + (7).to_bytes(4, "little") + data[12:], "format version 7"),
        "short": (data[:50], "truncated"),
    }
    for r in range(size):
        damages[f"section {r}"] = (flip(data, section_byte(r)), f"checksum mismatch in rank {r}'s section")
    for name, (damaged, words) in damages.items():
        path = folder / f"damaged-{name.replace(' ', '-')}.bin"
        if rank == 0:
            path.write_bytes(damaged)
        comm.Barrier()
        try:
            load_plan(comm, path, identity)
        except PlanRefused as error:
            assert words in str(error), (name, str(error))
        else:
            raise AssertionError(f"{name}: the damaged plan was accepted")
    try:
        load_plan(comm, folder / "missing.bin", identity)
    except PlanRefused as error:
        assert "cannot read" in str(error)
    else:
        raise AssertionError("a missing plan was accepted")
    plan, _ = load_plan(comm, plan_path, identity)  # the intact one loads
    assert plan.rank == rank and plan.size == size
    comm.Barrier()
    if rank == 0:
        print(f"refusal checks passed on {size} ranks")


main()
