"""The README's "Adding a capability" example experiment runs as written."""

from __future__ import annotations

import re
import types
from pathlib import Path

from gridcore.experiments.registry import Experiment, RunOptions

README = Path(__file__).resolve().parents[2] / "README.md"


def _block(first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"README has {len(found)} python blocks starting {first_line!r}"
    return found[0]


def test_the_readme_s_example_experiment_runs_and_renders_its_table() -> None:
    module = types.ModuleType("monitor_lag")
    exec(
        compile(_block("# gridcore/experiments/monitor_lag.py"), "README.md", "exec"),
        module.__dict__,
    )
    entry = module.MONITOR_LAG
    assert isinstance(entry, Experiment)
    result = entry.execute(RunOptions(seed=0))
    assert set(result["completion_s"]) == {"60", "300"}
    assert all(value > 0 for value in result["completion_s"].values())
    assert entry.render(result).splitlines()[0].split() == ["monitor_s", "completion_s"]
