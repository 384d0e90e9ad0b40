"""Sizing a logged machine whose log gives no size (gridcore.workloads.machines): the
processors its jobs held at once, time-weighted at the 0.99 quantile, at least its
largest job; a brief overlap of logged times does not size it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridcore.experiments.wait_prediction import load_workload
from gridcore.workloads.machines import MachineUse
from gridcore.workloads.swf import iter_jobs


def _log(path: Path, runs: list[tuple[float, float, float, int]], partition: int = 1) -> Path:
    """One SWF line per (submit, wait, run, processors) in ``partition``, no header."""
    path.write_text(
        "".join(
            f"{n} {submit:g} {wait:g} {run:g} {size} -1 -1 {size} 20000 -1 1 {n % 3 + 1}"
            f" -1 -1 -1 {partition} -1 -1\n"
            for n, (submit, wait, run, size) in enumerate(runs, start=1)
        )
    )
    return path


def _size(path: Path) -> tuple[int, str]:
    return MachineUse().extend(iter_jobs(path)).size()


def test_a_cluster_of_serial_jobs_is_sized_by_what_ran_at_once_not_its_largest_job(
    tmp_path: Path,
) -> None:
    # 40 one-processor jobs, 10 at a time back to back, and one 4-processor job alone
    runs = [(0.0, float(100 * (n // 10)), 100.0, 1) for n in range(40)] + [(0, 4000, 50, 4)]
    assert _size(_log(tmp_path / "serial.swf", runs)) == (
        10,
        "processors in use 0.99 of the time",
    )


def test_a_brief_overlap_of_logged_times_does_not_size_the_machine(tmp_path: Path) -> None:
    # four processors busy for 10,000 s; a fifth job logged over them for 50 s (0.5 %)
    runs = [(0.0, 0.0, 10_000.0, 1) for _ in range(4)] + [(0.0, 5000.0, 50.0, 1)]
    assert _size(_log(tmp_path / "overlap.swf", runs)) == (4, "processors in use 0.99 of the time")
    # the same fifth job over 5 % of the time is 0.99's business: five
    runs[-1] = (0.0, 5000.0, 500.0, 1)
    assert _size(_log(tmp_path / "overlap.swf", runs))[0] == 5


def test_a_job_ending_as_another_starts_is_not_counted_with_it(tmp_path: Path) -> None:
    runs = [(0.0, 0.0, 100.0, 6), (0.0, 100.0, 100.0, 6), (0.0, 200.0, 100.0, 6)]
    assert _size(_log(tmp_path / "chain.swf", runs)) == (6, "largest job")


def test_without_a_run_the_largest_job_sizes_it(tmp_path: Path) -> None:
    assert _size(_log(tmp_path / "zero.swf", [(0.0, 0.0, 0.0, 3), (1.0, 0.0, 0.0, 7)])) == (
        7,
        "largest job",
    )
    assert MachineUse().size() == (0, "largest job")


@pytest.mark.parametrize("cluster", [None, 1])
def test_the_wait_replay_sizes_a_log_without_max_procs_from_its_jobs(
    tmp_path: Path, cluster: int | None
) -> None:
    runs = [(0.0, float(100 * (n // 10)), 100.0, 1) for n in range(40)]
    workload = load_workload(str(_log(tmp_path / "serial.swf", runs)), cluster)
    where = "" if cluster is None else " of partition 1"
    assert (workload.processors, workload.processors_from) == (
        10,
        f"processors in use 0.99 of the time{where}",
    )
    assert len(workload.jobs) == 40  # none larger than the machine
