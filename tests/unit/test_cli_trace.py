"""``gridcore trace info`` run in-process (gridcore.cli.main): a workload log's summary as
text and as one JSON object, and a malformed, cut or missing log refused in one line with
exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridcore.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "swf"
TWO_CLUSTERS = DATA / "two-clusters.swf"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["trace", "info", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_summary_as_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(TWO_CLUSTERS), "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "path": str(TWO_CLUSTERS),
        "computer": "two test clusters (written by hand for gridcore's tests)",
        "installation": "none",
        "max_procs": 96,
        "max_partitions": 2,
        "unix_start_time": 1000000000,
        "jobs": 7,
        "first_submit_s": 0.0,
        "last_submit_s": 45.0,
        "span_s": 45.0,
        "first_submit_utc": "2001-09-09 01:46:40 UTC",
        "last_submit_utc": "2001-09-09 01:47:25 UTC",
        "partitions": {"1": 4, "2": 3},
        "size_unknown": 1,
        # counted by hand from the file's seven lines
        "unknown": {
            "wait_s": 1,
            "run_s": 1,
            "processors": 2,
            "cpu_s": 6,
            "memory_kb": 6,
            "requested_processors": 1,
            "requested_s": 1,
            "requested_memory_kb": 6,
            "user": 1,
            "group": 1,
            "executable": 2,
            "queue": 1,
            "partition": 0,
            "preceding_job": 5,
            "think_s": 5,
        },
        "statuses": {
            "CANCELLED": 1,
            "COMPLETED": 1,
            "FAILED": 1,
            "LAST_PARTIAL_COMPLETED": 1,
            "LAST_PARTIAL_FAILED": 1,
            "PARTIAL": 1,
            "UNKNOWN": 1,
        },
    }


def test_the_summary_as_text_of_a_real_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DATA / "sdsc-sp2-head.swf.gz"))
    assert code == 0
    lines = out.splitlines()
    assert lines[1:4] == [
        "machine     IBM SP2, SDSC",
        "max procs   128",
        "jobs        300 (0 of unknown size)",
    ]
    assert lines[4].startswith("span        ") and "1998-05-01" in lines[4]
    assert lines[5] == "partitions  none given (field 16 is -1)"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"1 0 10\n", "bad.swf:1: 3 fields, SWF has 18 per job line"),
        (
            b"; Version: 2.2\n" + b"1 0 10 100 8 -1 -1 8 200 -1 9 1 1 1 1 1 -1 -1\n",
            "bad.swf:2: field 11 (status): 9 is not an SWF status",
        ),
        (b"", "bad.swf: no job lines"),
    ],
    ids=["field count", "status", "empty"],
)
def test_a_malformed_log_exits_2_naming_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str
) -> None:
    bad = tmp_path / "bad.swf"
    bad.write_bytes(content)
    code, out, err = run(capsys, str(bad), "--json")
    assert (code, out) == (2, "")
    assert err.startswith("gridcore: error: ") and message in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_a_cut_gzip_log_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    whole = (DATA / "ctc-sp2-head.swf.gz").read_bytes()
    cut = tmp_path / "cut.swf.gz"
    cut.write_bytes(whole[: len(whole) // 3])
    code, out, err = run(capsys, str(cut))
    assert (code, out) == (2, "")
    assert "cut.swf.gz:" in err and "the gzip stream is cut short or corrupt" in err


def test_a_missing_log_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, str(tmp_path / "none.swf"))
    assert code == 2 and "none.swf: cannot read the log: No such file or directory" in err


def test_wait_prediction_replays_each_partition_of_a_multi_cluster_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # two-clusters.swf's partition-2 jobs plus one it can replay (its job 7 is a part of
    # a job, status 4, which every replay skips)
    log = tmp_path / "two.swf"
    log.write_text(TWO_CLUSTERS.read_text() + "8 50 0 20 16 -1 -1 16 60 -1 1 4 2 3 1 2 -1 -1\n")
    argv = ["experiment", "wait-prediction", "--trace", str(log), "--plot", ""]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["trace"]["partitions_replayed"] == [1, 2]
    assert {number: own["jobs"] for number, own in result["partitions"].items()} == {
        "1": 2,
        "2": 1,
    }
    assert result["skipped"]["part_line"] == 3
    assert main(argv) == 0
    assert "2 partitions replayed separately" in capsys.readouterr().out
