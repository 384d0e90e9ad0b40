"""The README's examples are what runs: the "Adding a capability" experiment runs as
written, and "A complete DAG" is ``dags/minimal.py`` (parsed and run by the Airflow tier)."""

from __future__ import annotations

import re
import types
from pathlib import Path

from gridcore.experiments.registry import Experiment, RunOptions

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


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


def test_the_readme_s_complete_dag_is_dags_minimal_py() -> None:
    """Issue 21 item 6: the DAG a user copies from the README is the one the DagBag test
    parses, character for character."""
    block = _block('"""The smallest complete gridcore DAG')
    assert block == (REPO / "dags" / "minimal.py").read_text()
    assert "SiteJobOperator(" in block and '"retries": 0' in block
