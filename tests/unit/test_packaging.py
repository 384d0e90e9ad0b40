"""The installed layout (issue 11 item 4): the Airflow layer is imported as
``gridcore_airflow.operators`` / ``gridcore_airflow.sensors`` (the folders ``operators/``
and ``sensors/`` mapped by package-dir), never as top-level ``operators`` / ``sensors``,
which would collide with the ``plugins/operators`` folders of many deployments."""

from __future__ import annotations

import ast
import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _setuptools() -> dict[str, object]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    tool: dict[str, object] = config["tool"]["setuptools"]
    return tool


def test_every_gridcore_package_is_installed() -> None:
    listed = set(_setuptools()["packages"])  # type: ignore[call-overload]
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "gridcore").rglob("__init__.py")
    }
    assert on_disk <= listed, f"packages missing from pyproject.toml: {on_disk - listed}"
    assert {
        "gridcore_airflow.demo",
        "gridcore_airflow.operators",
        "gridcore_airflow.sensors",
    } <= listed
    assert _setuptools()["package-dir"] == {
        "gridcore_airflow.demo": "demo",
        "gridcore_airflow.operators": "operators",
        "gridcore_airflow.sensors": "sensors",
    }


def _shipped_files() -> list[Path]:
    return sorted(
        p for p in (REPO / "gridcore").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def _package_of(path: Path) -> str:
    return ".".join(path.parent.relative_to(REPO).parts)


def test_every_folder_of_files_is_a_listed_package_with_its_data() -> None:
    """setuptools warned "Package 'gridcore.api.static' is absent from the `packages`
    configuration" (issue 21 item 6): a folder holding only data files (the Grid page's)
    is a package to setuptools too, and its files are that package's data."""
    listed = set(_setuptools()["packages"])  # type: ignore[call-overload]
    data: dict[str, list[str]] = _setuptools()["package-data"]  # type: ignore[assignment]
    files = _shipped_files()
    assert {_package_of(p) for p in files} - listed == set()
    unshipped = [
        str(p.relative_to(REPO))
        for p in files
        if p.suffix != ".py"
        and not any(fnmatch.fnmatch(p.name, pattern) for pattern in data.get(_package_of(p), []))
    ]
    assert unshipped == []
    assert set(data) <= listed


# a Python warning as setuptools prints it (pip's own notices are "WARNING: ...")
_WARNING = re.compile(r"\b\w+Warning: .*")


def test_the_wheel_builds_without_warnings_and_ships_every_file(tmp_path: Path) -> None:
    """``pip wheel`` of a copy of the sources (the build writes next to them): no warning
    from the build backend, and every file of gridcore/ (the Grid page's HTML, CSS and
    JavaScript, the migrations' templates) in the wheel."""
    src = tmp_path / "src"
    for folder in ("gridcore", "operators", "sensors", "demo"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert _WARNING.findall(done.stdout + done.stderr) == []
    (wheel,) = tmp_path.glob("gridcore-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [
        str(p.relative_to(REPO)) for p in _shipped_files() if str(p.relative_to(REPO)) not in names
    ]
    assert missing == []
    assert {"gridcore_airflow/operators/site_job.py", "gridcore_airflow/demo/harness.py"} <= names


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
    return names


def test_nothing_imports_the_airflow_layer_as_top_level_packages() -> None:
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for folder in ("gridcore", "operators", "sensors", "demo", "dags", "tests")
        for path in sorted((REPO / folder).rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in ("operators", "sensors", "demo")
    ]
    assert found == []
    assert "from gridcore_airflow.operators" in (REPO / "README.md").read_text()


def test_nothing_installed_imports_the_tests() -> None:
    """An installed gridcore has no tests/: nothing shipped may import from it."""
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for folder in ("gridcore", "operators", "sensors", "demo")
        for path in sorted((REPO / folder).rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] == "tests"
    ]
    assert found == []


def test_the_installed_package_imports_without_the_checkout_on_the_path(
    tmp_path: Path,
) -> None:
    """As a DAG in a deployment sees it: run from elsewhere, the checkout not on the
    path; the namespaced modules import, the bare folder names do not."""
    script = (
        "import importlib.util, sys\n"
        "import gridcore_airflow.operators.site_job, gridcore_airflow.sensors.triggers\n"
        "from gridcore_airflow.operators.plugin import GridcorePlugin\n"
        "import gridcore_airflow.demo.harness\n"
        "print(importlib.util.find_spec('operators'), importlib.util.find_spec('sensors'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None"]


AIRFLOW_MODULES = sorted(
    f"gridcore_airflow.{folder}" + ("" if path.stem == "__init__" else f".{path.stem}")
    for folder in ("operators", "sensors", "demo")
    for path in (REPO / folder).glob("*.py")
)


@pytest.mark.parametrize("module", AIRFLOW_MODULES)
def test_every_airflow_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    """Issue 21 item 20: importing one module first (as Airflow's provider discovery or a
    DAG may) must not hit a circular import."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
