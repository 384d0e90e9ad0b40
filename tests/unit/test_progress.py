"""Progress of long experiments and benchmarks goes to stderr, never stdout (issue 11
item 8): with ``--json`` stdout is one JSON object while the bars are drawn on stderr;
``$GRIDCORE_PROGRESS`` decides when (``auto``: on a terminal only; ``always``; ``never``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

import pytest

from gridcore.errors import ConfigError
from gridcore.progress import PROGRESS_ENV, progress, progress_mode, run_stages

CASES = 12  # selection-robustness cases: about a second


def gridcore(args: list[str], progress_setting: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_ENV}
    if progress_setting is not None:
        env[PROGRESS_ENV] = progress_setting
    return subprocess.run(
        [sys.executable, "-m", "gridcore.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


EXPERIMENT = ["experiment", "selection-robustness", "--cases", str(CASES), "--json", "--plot", ""]


def test_experiment_json_on_stdout_and_its_progress_on_stderr() -> None:
    done = gridcore(EXPERIMENT, "always")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # the whole of stdout is the one object
    assert result["cases"] == CASES
    assert "cases:" in done.stderr and f"/{CASES} [" in done.stderr, done.stderr
    assert "cases:" not in done.stdout and "\r" not in done.stdout


def test_no_bar_into_a_pipe_by_default_nor_when_disabled() -> None:
    for setting in (None, "never"):
        done = gridcore(EXPERIMENT, setting)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["cases"] == CASES
        assert "cases:" not in done.stderr, (setting, done.stderr)


def test_benchmark_stages_are_shown_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    # in-process: `gridcore bench placement` itself takes minutes of CPU
    import gridcore.experiments.bench_coallocation
    from gridcore.cli import main

    monkeypatch.setenv(PROGRESS_ENV, "always")
    bench = gridcore.experiments.bench_coallocation
    monkeypatch.setattr(bench, "bench_close_to_files", lambda: {"cf_ms": 1.0})
    monkeypatch.setattr(bench, "bench_scan", lambda jobs, sites: {})
    out, err = _run_cli(["bench", "placement", "--json"], main)
    assert json.loads(out) == {"cf_ms": 1.0}
    assert "bench placement:" in err and "CF latency" in err and "queue scan" in err, err


def _run_cli(args: list[str], main: object) -> tuple[str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert callable(main)
        assert main(args) == 0
    return out.getvalue(), err.getvalue()


def test_a_bad_setting_is_refused_naming_the_variable() -> None:
    done = gridcore(EXPERIMENT, "sometimes")
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"${PROGRESS_ENV}: must be one of auto, always, never, got 'sometimes'" in done.stderr


@pytest.mark.parametrize(
    ("setting", "shown"), [("always", True), ("never", False), ("auto", False), ("", False)]
)
def test_bars_go_to_stderr_as_the_setting_says(
    setting: str, shown: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(PROGRESS_ENV, setting)  # capsys's stderr is no terminal: auto is off

    assert sum(progress(range(5), "counting", unit="n")) == 10
    stages: Mapping[str, object] = run_stages("staged", {"one": lambda: 1, "two": lambda: 2})

    assert stages == {"one": 1, "two": 2}
    captured = capsys.readouterr()
    assert captured.out == ""
    assert ("counting:" in captured.err and "staged:" in captured.err) is shown, captured.err
    assert ("two" in captured.err) is shown


def test_progress_mode_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert progress_mode() == "auto"
    monkeypatch.setenv(PROGRESS_ENV, " ALWAYS ")
    assert progress_mode() == "always"
    monkeypatch.setenv(PROGRESS_ENV, "1")
    with pytest.raises(ConfigError, match=PROGRESS_ENV):
        progress_mode()
