"""The SWF 2.2 reader (issue 22 item 1): every field of a hand-written log as read, the
header, the partition filter, gzip told by its bytes, one table row per rule a malformed
log breaks (each message naming file, line and field), the first 300 jobs of three real
logs, and reading in memory that does not grow with the log."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest

from gridcore.errors import ConfigError
from gridcore.workloads.swf import SwfError, SwfJob, SwfStatus, iter_jobs, read_header

DATA = Path(__file__).resolve().parents[1] / "data" / "swf"
TWO_CLUSTERS = DATA / "two-clusters.swf"
GOOD = "    1        0     10    100    8     -1   -1    8    200   -1  1  1  1  1  1  1 -1 -1"


def _job_line(**changes: str) -> str:
    """GOOD with fields replaced, by 1-based field number: _job_line(f4="abc")."""
    words = GOOD.split()
    for key, word in changes.items():
        words[int(key[1:]) - 1] = word
    return " ".join(words)


def _write(tmp_path: Path, lines: list[str], name: str = "log.swf") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_the_hand_written_log_is_read_field_by_field() -> None:
    jobs = list(iter_jobs(TWO_CLUSTERS))
    assert [j.number for j in jobs] == [1, 2, 3, 4, 5, 6, 7]
    assert jobs[0] == SwfJob(
        number=1,
        submit_s=0.0,
        wait_s=10.0,
        run_s=100.0,
        processors=8,
        cpu_s=90.5,
        memory_kb=None,
        requested_processors=8,
        requested_s=200.0,
        requested_memory_kb=None,
        status=SwfStatus.COMPLETED,
        user=1,
        group=1,
        executable=1,
        queue=1,
        partition=1,
        preceding_job=None,
        think_s=None,
        line=15,
    )
    third = jobs[2]
    assert (third.run_s, third.memory_kb, third.requested_memory_kb) == (50.5, 1024, 2048)
    assert (third.preceding_job, third.think_s, third.status) == (1, 30.0, SwfStatus.FAILED)
    # the comment line and the blank line between jobs 3 and 4 are counted, not read
    assert [j.line for j in jobs] == [15, 16, 17, 20, 21, 22, 23]
    assert [j.status for j in jobs] == [
        SwfStatus.COMPLETED,
        SwfStatus.CANCELLED,
        SwfStatus.FAILED,
        SwfStatus.UNKNOWN,
        SwfStatus.PARTIAL,
        SwfStatus.LAST_PARTIAL_COMPLETED,
        SwfStatus.LAST_PARTIAL_FAILED,
    ]


def test_sizes_and_times_derived_from_what_the_log_knows() -> None:
    jobs = {j.number: j for j in iter_jobs(TWO_CLUSTERS)}
    assert (jobs[1].size, jobs[1].start_s, jobs[1].end_s) == (8, 10.0, 110.0)
    # cancelled before it started: no allocation, no wait, no run; the request is its size
    assert (jobs[2].size, jobs[2].start_s, jobs[2].end_s) == (16, None, None)
    # neither allocated nor requested processors known: no size, and not an error
    assert jobs[4].processors is None and jobs[4].requested_processors is None
    assert (jobs[4].size, jobs[4].start_s, jobs[4].end_s) == (None, 120.0, 150.0)


def test_a_zero_processor_count_is_no_size(tmp_path: Path) -> None:
    zero = _write(tmp_path, [_job_line(f5="0", f8="4"), _job_line(f1="2", f5="0", f8="0")])
    assert [j.size for j in iter_jobs(zero)] == [4, None]


def test_partition_keeps_one_clusters_jobs() -> None:
    assert [j.number for j in iter_jobs(TWO_CLUSTERS, partition=2)] == [2, 4, 7]
    assert [j.number for j in iter_jobs(TWO_CLUSTERS, partition=1)] == [1, 3, 5, 6]
    assert list(iter_jobs(TWO_CLUSTERS, partition=3)) == []


def test_the_partition_filter_still_checks_every_line(tmp_path: Path) -> None:
    log = _write(tmp_path, [GOOD, _job_line(f1="2", f16="2", f3="-7")])
    with pytest.raises(SwfError, match=r":2: field 3 \(wait time\)"):
        list(iter_jobs(log, partition=1))


def test_the_header_keys_continuations_and_repeats() -> None:
    header = read_header(TWO_CLUSTERS)
    assert header.path == str(TWO_CLUSTERS)
    assert header.fields["Version"] == "2.2"
    assert header.fields["Information"] == (
        "tests/data/swf/README.md\na continuation line of Information"
    )
    assert header.fields["Partition"] == "1 alpha (64 processors)\n2 beta (32 processors)"
    assert header.fields["Note"] == (
        "statuses -1..5 each appear once;\njob 4 knows neither allocated nor requested processors"
    )
    # MaxProcs wins over MaxNodes
    assert (header.max_procs, header.unix_start_time, header.partitions) == (96, 1000000000, 2)


def test_max_nodes_stands_in_for_max_procs_and_later_comments_are_not_header(
    tmp_path: Path,
) -> None:
    log = _write(
        tmp_path,
        ["; MaxNodes: 338 (batch partition; 512 total)", GOOD, "; MaxProcs: 7", "; Late: x"],
    )
    header = read_header(log)
    assert (header.max_procs, header.unix_start_time, header.partitions) == (338, None, None)
    assert dict(header.fields) == {"MaxNodes": "338 (batch partition; 512 total)"}
    assert [j.number for j in iter_jobs(log)] == [1]


@pytest.mark.parametrize(
    ("name", "machine", "max_procs", "first", "last", "opening"),
    [
        ("ctc-sp2-head.swf.gz", "Cornell Theory Center (CTC)", 338, 1, 300, (0, 588530, 937, 306)),
        ("sdsc-sp2-head.swf.gz", "SDSC", 128, 11, 310, (566129, 5, 28826, 1)),
        (
            "kth-sp2-head.swf.gz",
            "Swedish Royal Institute of Technology (KTH)",
            100,
            15,
            314,
            (599850, 192180, 3477, 4),
        ),
    ],
)
def test_the_first_300_jobs_of_three_real_logs(
    name: str,
    machine: str,
    max_procs: int,
    first: int,
    last: int,
    opening: tuple[float, float, float, int],
) -> None:
    header = read_header(DATA / name)
    assert (header.fields["Computer"], header.fields["Installation"]) == ("IBM SP2", machine)
    assert header.max_procs == max_procs and header.fields["Version"] == "2.2"
    jobs = list(iter_jobs(DATA / name))
    assert (len(jobs), jobs[0].number, jobs[-1].number) == (300, first, last)
    assert all(j.size is not None and 0 < j.size <= max_procs for j in jobs)
    assert (jobs[0].submit_s, jobs[0].wait_s, jobs[0].run_s, jobs[0].processors) == opening


def test_gzip_is_told_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    text = TWO_CLUSTERS.read_text()
    zipped = tmp_path / "log.swf"
    zipped.write_bytes(gzip.compress(text.encode()))
    plain = tmp_path / "log.swf.gz"
    plain.write_text(text)
    expected = list(iter_jobs(TWO_CLUSTERS))
    assert list(iter_jobs(zipped)) == expected == list(iter_jobs(plain))
    assert read_header(zipped).fields == read_header(TWO_CLUSTERS).fields


def test_numbers_written_as_decimals(tmp_path: Path) -> None:
    # "-1.00" is unknown in any field; "4.00" is 4 in a count
    line = _job_line(f5="4.00", f6="-1.00", f11="1.0", f17="-1.0")
    (job,) = iter_jobs(_write(tmp_path, [line]))
    assert (job.processors, job.cpu_s, job.status, job.preceding_job) == (4, None, 1, None)
    assert isinstance(job.processors, int)


BAD_LINES = [
    ("too few fields", [" ".join(GOOD.split()[:17])], "1: 17 fields, SWF has 18 per job line"),
    ("too many fields", [GOOD + " 9"], "1: 19 fields, SWF has 18 per job line"),
    ("not a number", [_job_line(f4="12s")], "1: field 4 (run time): '12s' is not a number"),
    ("not an integer", [_job_line(f8="x")], "1: field 8 (requested processors): 'x' is not an"),
    (
        "a fraction in a count",
        [_job_line(f5="4.5")],
        "1: field 5 (allocated processors): 4.5 is not an integer",
    ),
    ("not finite", [_job_line(f9="inf")], "1: field 9 (requested time): inf is not a finite"),
    ("nan", [_job_line(f6="nan")], "1: field 6 (average CPU time): nan is not a finite"),
    (
        "negative other than -1",
        [GOOD, _job_line(f1="2", f3="-5")],
        "2: field 3 (wait time): -5 is negative (only -1, unknown)",
    ),
    (
        "negative user",
        [_job_line(f12="-2")],
        "1: field 12 (user id): -2 is negative (only -1, unknown)",
    ),
    (
        "unknown submit time",
        [_job_line(f2="-1")],
        "1: field 2 (submit time): -1 (unknown), but SWF's job number and submit time are",
    ),
    ("unknown job number", [_job_line(f1="-1")], "1: field 1 (job number): -1 (unknown)"),
    (
        "decreasing submit time",
        [_job_line(f2="5"), "; between", _job_line(f1="2", f2="3")],
        "3: field 2 (submit time): 3 is earlier than the previous job's 5",
    ),
    ("status 6", [_job_line(f11="6")], "1: field 11 (status): 6 is not an SWF status"),
    ("status -2", [_job_line(f11="-2")], "1: field 11 (status): -2 is negative"),
]


@pytest.mark.parametrize(
    ("lines", "message"), [r[1:] for r in BAD_LINES], ids=[r[0] for r in BAD_LINES]
)
def test_a_malformed_line_is_refused_naming_file_line_and_field(
    tmp_path: Path, lines: list[str], message: str
) -> None:
    log = _write(tmp_path, lines)
    with pytest.raises(SwfError) as caught:
        list(iter_jobs(log))
    assert str(caught.value).startswith(f"{log}:{message}")


def test_jobs_before_a_bad_line_stream_out_first(tmp_path: Path) -> None:
    log = _write(tmp_path, [GOOD, _job_line(f1="2", f2="1"), _job_line(f1="3", f4="?")])
    jobs = iter_jobs(log)
    assert [next(jobs).number, next(jobs).number] == [1, 2]
    with pytest.raises(SwfError, match=r":3: field 4 \(run time\)"):
        next(jobs)


def test_equal_submit_times_are_in_order(tmp_path: Path) -> None:
    log = _write(tmp_path, [_job_line(f2="5"), _job_line(f1="2", f2="5")])
    assert [j.submit_s for j in iter_jobs(log)] == [5.0, 5.0]


@pytest.mark.parametrize(
    "content",
    [b"", b"; Version: 2.2\n; Computer: none\n", b"\n\n"],
    ids=["empty", "header", "blank"],
)
def test_a_log_without_jobs_is_refused(tmp_path: Path, content: bytes) -> None:
    log = tmp_path / "log.swf"
    log.write_bytes(content)
    with pytest.raises(SwfError, match=r"log\.swf: no job lines"):
        list(iter_jobs(log))


def test_a_truncated_gzip_log_is_a_clear_error(tmp_path: Path) -> None:
    whole = (DATA / "ctc-sp2-head.swf.gz").read_bytes()
    cut = tmp_path / "cut.swf.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    jobs = 0
    with pytest.raises(SwfError, match=r"cut\.swf\.gz:\d+: the gzip stream is cut short") as e:
        for _ in iter_jobs(cut):
            jobs += 1
    assert 0 < jobs < 300  # what came before the cut was read
    assert f"after line {jobs + 29}" in str(e.value)  # 29 header lines in this log


def test_a_corrupt_gzip_log_is_a_clear_error(tmp_path: Path) -> None:
    whole = bytearray((DATA / "kth-sp2-head.swf.gz").read_bytes())
    whole[200:260] = bytes(60)
    bad = tmp_path / "bad.swf.gz"
    bad.write_bytes(bytes(whole))
    with pytest.raises(SwfError, match=r"bad\.swf\.gz:\d+: the gzip stream is cut short or corr"):
        list(iter_jobs(bad))


def test_a_missing_log_is_a_clear_error(tmp_path: Path) -> None:
    missing = r"nope\.swf: cannot read the log: No such file"
    with pytest.raises(SwfError, match=missing):
        read_header(tmp_path / "nope.swf")
    with pytest.raises(SwfError, match=missing):
        list(iter_jobs(tmp_path / "nope.swf"))


def test_an_swf_error_is_bad_input_to_the_cli() -> None:
    assert issubclass(SwfError, ConfigError)


LINES = 50_000
BOUND = 256 * 1024


def test_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    """50,000 jobs read in under 256 KiB of traced memory at the peak; holding only 2,000
    of the jobs takes more than that, so a reader that kept its jobs would fail here."""
    log = tmp_path / "big.swf"
    with log.open("w") as out:
        out.write("; Version: 2.2\n")
        for i in range(1, LINES + 1):
            out.write(
                f"{i} {i * 3} {i % 97} {i % 3600} {1 + i % 64} -1 -1 {1 + i % 64} 3600 -1"
                f" 1 {i % 50} -1 -1 1 {1 + i % 2} -1 -1\n"
            )
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_jobs(log))
        _, streaming_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        held = [job for job, _ in zip(iter_jobs(log), range(2_000), strict=False)]
        _, holding_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == LINES and len(held) == 2_000
    assert streaming_peak < BOUND < holding_peak
