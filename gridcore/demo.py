"""``gridcore demo``: an ensemble burst on the embedded default (three local sites).

Members arrive together, as forcing data does; each is placed by the stateful selector
(shared state DB), runs a small real computation (a 1-D damped wave relaxation with
numpy, a stand-in for a surge model) as a subprocess on its site, and the demo prints
where each member ran and how long it queued.

It also says where the embedded default keeps its state for a demo or a test session
(:class:`GridcoreEnv`): ``make demo`` (``gridcore_airflow.demo``, the example
DAGs through Airflow) and the integration tests prepare with it.
"""

from __future__ import annotations

import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.errors import GridError
from gridcore.model import JobRequest, JobState, JobSubmission

UNSET_FOR_DEFAULT = ("GRIDCORE_GRID", "GRIDCORE_CENTER_URL")
"""Variables that would take gridcore off the embedded default (a grid file, a VJ center):
the integration tests remove them; ``make demo`` keeps them (a user's own grid)."""


@dataclass(frozen=True)
class GridcoreEnv:
    """Where gridcore keeps its state for one demo or test session."""

    base: Path
    gridcore_home: Path
    db_url: str
    forcing_dir: Path

    @classmethod
    def under(cls, base: Path) -> GridcoreEnv:
        return cls(
            base=base,
            gridcore_home=base / "gridcore",
            db_url=f"sqlite:///{base / 'gridcore-state.db'}",
            forcing_dir=base / "forcing",
        )

    def variables(self) -> dict[str, str]:
        """The environment gridcore, the DAGs and their tasks read: gridcore's home, its
        state database and the forcing directory under :attr:`base`."""
        return {
            "GRIDCORE_HOME": str(self.gridcore_home),
            "GRIDCORE_DB_URL": self.db_url,
            "GRIDCORE_FORCING_DIR": str(self.forcing_dir),
        }


# A real, small numerical kernel so members take CPU time proportional to their steps.
MEMBER_PROGRAM = """
import numpy as np, os, sys
steps = int(sys.argv[1]); n = 4000
x = np.linspace(0, 1, n); eta = np.exp(-((x - float(sys.argv[2])) / 0.05) ** 2); u = np.zeros(n)
for _ in range(steps):
    u[1:-1] -= 0.4 * (eta[2:] - eta[:-2]); eta[1:-1] -= 0.4 * (u[2:] - u[:-2]); u *= 0.999
print(f"site={os.environ['GRIDCORE_SITE']} peak_surge={eta.max():.6f}")
"""


@dataclass(frozen=True)
class DemoResult:
    records: tuple[JobRecord, ...]
    wall_s: float

    @property
    def ok(self) -> bool:
        return all(r.state == JobState.COMPLETED for r in self.records)

    def sites_used(self) -> set[str]:
        return {r.site for r in self.records}


def run_demo(
    runtime: GridRuntime,
    members: int = 10,
    steps: int = 3000,
    seed: int = 2008,
    log: Callable[[str], None] = print,
    timeout_s: float = 300.0,
) -> DemoResult:
    """Submit ``members`` as one burst, wait for all, return their records."""
    rng = random.Random(seed)
    start = time.time()
    ids = []
    for i in range(members):
        procs = rng.choice((2, 2, 3, 4))
        request = JobRequest(f"member-{i:02d}", procs, runtime_s=10.0)
        record = runtime.select(request, stream="demo")
        program = f"{shlex.quote(sys.executable)} -c {shlex.quote(MEMBER_PROGRAM)}"
        command = f"{program} {steps} {rng.uniform(0.2, 0.8):.3f}"
        runtime.submit(record.selection_id, JobSubmission(request.name, command, procs))
        log(f"selected {request.name} ({procs} procs) -> {record.site} [{record.outcome}]")
        ids.append(record.selection_id)
    records = _wait(runtime, ids, timeout_s)
    return DemoResult(tuple(records), time.time() - start)


def _wait(runtime: GridRuntime, ids: list[int], timeout_s: float) -> list[JobRecord]:
    deadline = time.time() + timeout_s
    while True:
        records = [runtime.poll(i) for i in ids]
        if all(r.finished for r in records):
            return records
        if time.time() > deadline:
            for r in records:
                if not r.finished:
                    runtime.cancel(r.selection_id)
            raise GridError(f"demo members still running after {timeout_s:.0f} s; cancelled them")
        time.sleep(0.25)


def format_table(result: DemoResult) -> str:
    lines = [f"{'member':<10} {'procs':>5} {'site':<10} {'state':<10} {'queued_s':>8} {'ran_s':>6}"]
    for r in result.records:
        ran = (r.finished_at or 0) - (r.started_at or 0) if r.started_at else 0.0
        lines.append(
            f"{r.name:<10} {r.processors:>5} {r.site:<10} {r.state:<10} "
            f"{(r.queued_s or 0.0):>8.2f} {ran:>6.2f}"
        )
    lines.append(
        f"{len(result.records)} members on {len(result.sites_used())} sites"
        f" in {result.wall_s:.1f} s"
    )
    return "\n".join(lines)
