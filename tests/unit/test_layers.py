"""The layers of gridcore run one way (issue 23 item 5): the state database and its
capacity ledger at the bottom, then the pure policies, the site adapters, staging, and
the engines, data-plan planning (above the simulator it runs), the API and the
experiments on top. A module imports only from its own layer or the ones below it, so
no cycle can form between them (staging once imported the engines' ledger while the
engines imported staging; health called back into the runtime)."""

from __future__ import annotations

import ast
from pathlib import Path

GRIDCORE = Path(__file__).resolve().parents[2] / "gridcore"
LAYERS = (
    "state",
    "policies",
    "sim",
    "sites",
    "staging",
    "engine",
    "dataplan",
    "api",
    "experiments",
)
# File formats sit with config.py beneath every layer: any layer may read them.
FORMATS = frozenset({"gridcore.dataplan.format"})


def _layer_imports(path: Path) -> set[str]:
    """The gridcore layers ``path`` imports, however it names them (``from gridcore
    import state``, ``from gridcore.state import capacity``, ``import gridcore.sites``),
    at the top, inside functions or under TYPE_CHECKING alike."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        for module in modules:
            if any(module == f or module.startswith(f"{f}.") for f in FORMATS):
                continue
            parts = module.split(".")
            if parts[0] == "gridcore" and len(parts) > 1 and parts[1] in LAYERS:
                found.add(parts[1])
    return found


def test_each_layer_imports_only_itself_and_the_layers_below() -> None:
    upward = [
        f"{path.relative_to(GRIDCORE)} imports gridcore.{layer}"
        for own in LAYERS
        for path in sorted((GRIDCORE / own).rglob("*.py"))
        for layer in sorted(_layer_imports(path))
        if LAYERS.index(layer) > LAYERS.index(own)
    ]
    assert upward == []


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from gridcore.engine.runtime import GridRuntime\n"
        "def f():\n"
        "    from gridcore import staging\n"
    )
    assert _layer_imports(module) == {"engine", "staging"}
