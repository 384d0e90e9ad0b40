"""``gridcore replay``'s refusals: each bad option, grid site, log file or log line exits
2 with one line naming it, before the state database is even created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridcore.cli import main

KTH = Path(__file__).resolve().parents[1] / "data" / "swf" / "kth-sp2-head.swf.gz"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("GRIDCORE_HOME", str(home))
    for name in ("GRIDCORE_GRID", "GRIDCORE_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    return home


def _bad_log(tmp_path: Path) -> Path:
    path = tmp_path / "bad.swf"
    good = "1 0 1 10 1 -1 -1 1 60 -1 1 1 1 -1 -1 -1 -1 -1"
    path.write_text(f"; Version: 2.2\n{good}\n2 5 1 10 x -1 -1 1 60 -1 1 1 1 -1 -1 -1 -1 -1\n")
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speedup", "0"], "--speedup 0: must be a positive number"),
        (["--max-jobs", "0"], "--max-jobs 0: must be at least 1"),
        (["--window", "9"], "--window '9': not START:END"),
        (["--site-map", "x=local-a"], "--site-map 'x=local-a': partition 'x'"),
        (["--site-map", "*=gamma"], "unknown site 'gamma' (the grid has: local-a, local-b"),
        (["--window", "1000d:"], "no job to replay in --window 1000d: with --site-map"),
        # the head of KTH starts at log second 599850: at speedup 1, days after 0
        (["--speedup", "1", "--window", "0:"], "no job is due before --max-duration 600 s"),
    ],
)
def test_bad_options_exit_2_naming_them_before_anything_is_written(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    options = {"--speedup": "100", "--site-map": "*=local-a"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        options[flag] = value
    argv = ["replay", str(KTH), *(word for pair in options.items() for word in pair)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gridcore: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (home / "state.db").exists()


def test_a_malformed_log_line_exits_2_naming_file_line_and_field(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _bad_log(tmp_path)
    assert main(["replay", str(log), "--speedup", "1", "--site-map", "*=local-a"]) == 2
    err = capsys.readouterr().err
    assert f"{log}:3: field 5 (allocated processors): 'x' is not an integer" in err, err
    assert not (home / "state.db").exists()


def test_a_missing_log_exits_2(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "/nonexistent.swf", "--speedup", "1", "--site-map", "*=local-a"]) == 2
    assert "/nonexistent.swf: cannot read the log" in capsys.readouterr().err
    assert not (home / "state.db").exists()


def test_a_site_that_cannot_be_reached_exits_1_before_anything_is_submitted(
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    grid = tmp_path / "grid.toml"
    # port 9 on the loopback: nothing listens, the connection is refused at once
    grid.write_text(
        'version = 1\n\n[sites.down]\nkind = "slurm"\nprocessors = 8\n'
        'url = "http://127.0.0.1:9"\ntoken = { env = "DOWN_TOKEN" }\n'
        f'storage_dir = "{tmp_path}"\n'
    )
    monkeypatch.setenv("DOWN_TOKEN", "t")
    argv = ["replay", str(KTH), "--grid", str(grid), "--speedup", "100", "--site-map", "*=down"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("gridcore: error: ")]
    assert len(errors) == 1 and errors[0].startswith("gridcore: error: site down: cannot reach")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["k1-2"], "RUN 'k1-2': not a replay's run id"),
        (["k 1"], "RUN 'k 1': not a replay's run id"),
        (["k1", "--site-map", "*=gamma"], "unknown site 'gamma' (the grid has: local-a"),
        (["k1", "--site-map", "x"], "--site-map 'x': not PARTITION=SITE"),
    ],
)
def test_replay_cancel_refuses_bad_input_in_one_line_before_anything_is_written(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["replay-cancel", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gridcore: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (home / "state.db").exists()


def test_replay_cancel_with_nothing_of_the_run_left_exits_0(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay-cancel", "3f9a1c", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["run"], data["found"], data["left_running"]) == ("3f9a1c", 0, [])
    assert data["sites"] == ["local-a", "local-b", "local-c"]
