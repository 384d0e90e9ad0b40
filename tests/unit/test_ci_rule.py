"""The root conftest.py's CI rule, run for real: throw-away test modules, each not running
its test in one way, are run by pytest in a subprocess with the repository's conftest.py
beside them. Under a truthy CI every one of them must fail; without CI they skip (so it is
the rule, not a broken module, that fails them)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Module name -> source: one way each of not running (or not checking) a test.
WAYS = {
    "test_runtime_skip": "import pytest\n\ndef test_it():\n    pytest.skip('no service')\n",
    "test_skip_marker": (
        "import pytest\n\n@pytest.mark.skip(reason='later')\ndef test_it():\n    pass\n"
    ),
    "test_skipif_marker": (
        "import pytest\n\n@pytest.mark.skipif(True, reason='never here')\n"
        "def test_it():\n    pass\n"
    ),
    "test_fixture_skip": (
        "import pytest\n\n@pytest.fixture\ndef service():\n    pytest.skip('no service')\n\n"
        "def test_it(service):\n    pass\n"
    ),
    "test_module_skip": (
        "import pytest\n\npytest.skip('whole module', allow_module_level=True)\n\n"
        "def test_it():\n    pass\n"
    ),
    "test_importorskip": (
        "import pytest\n\npytest.importorskip('gridcore_no_such_module')\n\n"
        "def test_it():\n    pass\n"
    ),
    "test_xfail_marker": (
        "import pytest\n\n@pytest.mark.xfail(reason='known bug')\ndef test_it():\n"
        "    assert False\n"
    ),
    "test_xpass_marker": (
        "import pytest\n\n@pytest.mark.xfail(reason='known bug')\ndef test_it():\n    pass\n"
    ),
    "test_runtime_xfail": "import pytest\n\ndef test_it():\n    pytest.xfail('known bug')\n",
}
CONTROL = "test_control"  # a test that passes: the rule must leave it alone


def run_modules(tmp_path: Path, ci: str | None) -> tuple[int, dict[str, str]]:
    """Run every module of WAYS (and the control) under ``CI=ci`` (unset for None);
    returns pytest's exit code and each module's outcome from the JUnit XML report
    (passed, failed, error, skipped)."""
    (tmp_path / "conftest.py").write_text((REPO / "conftest.py").read_text())
    # Its own ini file: the repository's pytest options stay out of the run.
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    for name, source in WAYS.items():
        (tmp_path / f"{name}.py").write_text(source)
    (tmp_path / f"{CONTROL}.py").write_text("def test_it():\n    assert 1 + 1 == 2\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    report = tmp_path / "report.xml"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            f"--junitxml={report}",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.exists(), completed.stdout + completed.stderr
    return completed.returncode, outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        # A test's classname is its module; a module that failed or skipped at
        # collection is reported with no classname and the module as its name.
        module = (case.get("classname") or case.get("name", "")).split(".")[0]
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
        assert module not in found, f"{module} reported twice"
        found[module] = outcome
    return found


@pytest.mark.parametrize("ci", ["true", "1", "Yes"])
def test_under_ci_every_way_of_not_running_a_test_fails(tmp_path: Path, ci: str) -> None:
    code, found = run_modules(tmp_path, ci)

    assert code != 0
    assert found[CONTROL] == "passed"
    not_failed = {
        name: found.get(name, "absent")
        for name in WAYS
        if found.get(name) not in ("failed", "error")
    }
    assert not_failed == {}, f"under CI={ci} these did not fail: {not_failed}"


@pytest.mark.parametrize("ci", [None, "false", "0"])
def test_without_ci_the_same_modules_skip_and_xfail(tmp_path: Path, ci: str | None) -> None:
    code, found = run_modules(tmp_path, ci)

    assert code == 0, found
    assert found.pop(CONTROL) == "passed"
    assert found.pop("test_xpass_marker") == "passed"  # XPASS (not strict) is a pass
    assert found == dict.fromkeys(set(WAYS) - {"test_xpass_marker"}, "skipped")
