"""What the README, docs/ and the example DAGs point a reader at exists for the reader:
every dotted module path imports (dags/job_output.py named ``operators.site_job``, which
an installed gridcore does not have), and nothing points at the maintainers' own folder
(the README cited ``../shared/seeds/`` for the papers; docs/papers.md cites them)."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# gridcore.x.y or gridcore_airflow.x.y, not inside a file name or a longer dotted name
DOTTED = re.compile(r"(?<![\w./-])(gridcore(?:_airflow)?(?:\.[A-Za-z_]\w*)+)")
# the Airflow layer under the folder names it is not installed as
BARE_LAYER = re.compile(r"(?<![\w./-])((?:operators|sensors|demo)\.[a-z_]\w*(?:\.\w+)*)")
# README's "Adding a capability" example: a module the reader would add
EXAMPLES = frozenset({"gridcore.experiments.monitor_lag"})
MAINTAINERS_FOLDER = re.compile(r"\.\./shared/|/work/shared|shared/seeds|seeds/\S+\.md")


def _reader_texts() -> Iterator[tuple[str, str]]:
    """README.md, docs/*.md, and the docstrings of the example DAGs (rendered in the UI)."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        yield path.relative_to(REPO).as_posix(), path.read_text()
    for path in sorted((REPO / "dags").glob("*.py")):
        tree = ast.parse(path.read_text())
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.FunctionDef)]
        docs = [ast.get_docstring(n) or "" for n in nodes]
        yield path.relative_to(REPO).as_posix(), "\n".join(docs)


def _resolves(dotted: str) -> bool:
    """The longest importable module prefix, then attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_every_dotted_path_the_docs_name_imports() -> None:
    named = {(where, m) for where, text in _reader_texts() for m in DOTTED.findall(text)}
    assert len(named) > 50  # the scan sees the docs
    broken = sorted((w, m) for w, m in named if m not in EXAMPLES and not _resolves(m))
    assert broken == []


def test_the_airflow_layer_is_named_as_installed() -> None:
    bare = sorted((w, m) for w, text in _reader_texts() for m in BARE_LAYER.findall(text))
    assert bare == []


@pytest.mark.parametrize(
    "folder", ["README.md", "Makefile", "docs", "dags", "gridcore", "operators", "sensors"]
)
def test_nothing_points_at_the_maintainers_shared_folder(folder: str) -> None:
    root = REPO / folder
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        if path.suffix in ("", ".md", ".py", ".toml", ".js", ".html", ".txt")
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if MAINTAINERS_FOLDER.search(line)
    ]
    assert found == []
