"""Launching the split Poisson solve (``gridcore.apps.poisson``) from the example DAGs:
the command every component runs and the check of its strips. Kept apart from the solver
so that parsing a DAG does not import numpy."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from gridcore.state.store import state_dir

MAX_ABS_DIFF = 1e-8  # a split solve agrees with the serial one to the last bit
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def output_dir(run_id: str) -> Path:
    """Where the components of one run write their strips: under ``$GRIDCORE_HOME``,
    which every site of the grid must see (local sites and same-host Slurm do)."""
    return state_dir() / "poisson" / f"poisson-{_UNSAFE.sub('_', run_id)}"


def component_command(n: int, iterations: int, sizes: Sequence[int], out_dir: Path) -> str:
    """The command every component runs once all have started (after KOALA's barrier or
    in VJM's pilots). The interpreter by absolute path: Slurm jobs get PATH only.
    ``$GRIDCORE_COMPONENT`` is set by the barrier or the pilot."""
    return (
        f"{shlex.quote(sys.executable)} -m gridcore.apps.poisson"
        f" --n {int(n)} --iterations {int(iterations)}"
        f" --sizes {','.join(str(int(s)) for s in sizes)}"
        f' --out {shlex.quote(str(out_dir))}/strip-"$GRIDCORE_COMPONENT".npy'
    )


def strips_difference(out_dir: Path, count: int, n: int, iterations: int) -> float:
    """Largest difference between the components' strips, reassembled, and the serial
    solve."""
    import numpy as np

    from gridcore.apps.poisson import max_abs_difference_from_serial

    strips = [np.load(out_dir / f"strip-{i}.npy", allow_pickle=False) for i in range(count)]
    return max_abs_difference_from_serial(strips, n, iterations)
