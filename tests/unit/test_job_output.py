"""Following a job's own output (gridcore.sites.output) on real files, the local site's
real jobs, and the Slurm adapter's answer to where a job's output is (canned slurmrestd
bodies through the fake transport of test_slurm_errors)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gridcore.engine.runtime import GridRuntime
from gridcore.errors import UnknownJob
from gridcore.model import JobRequest, JobSubmission
from gridcore.sites.output import (
    JobOutputs,
    OutputFiles,
    OutputFollower,
    OutputLimits,
    SiteJob,
    failure_tails,
    split_lines,
    stderr_tail,
)
from gridcore.sites.slurm import expand_filename_pattern
from tests.unit.test_slurm_errors import body, make_site


def files_in(tmp_path: Path) -> OutputFiles:
    return OutputFiles(str(tmp_path / "stdout.txt"), str(tmp_path / "stderr.txt"))


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


# -- reading new lines ---------------------------------------------------------------------


def test_each_read_returns_only_the_lines_written_since_the_last(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    follower = OutputFollower(files)
    append(files.stdout, b"one\ntwo\n")
    append(files.stderr, b"warn 1\n")

    assert follower.read() == ["[stdout] one", "[stdout] two", "[stderr] warn 1"]
    assert follower.read() == []
    append(files.stdout, b"three\n")
    assert follower.read() == ["[stdout] three"]
    assert follower.shown() == {"stdout": 14, "stderr": 7}


def test_a_partial_line_waits_for_its_end_or_for_the_job_to_finish(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    follower = OutputFollower(files, prefix="[component 1 @ beta] ")
    append(files.stdout, b"progress: 10%")
    assert follower.read() == []
    append(files.stdout, b" 20%\nlast words")
    assert follower.read() == ["[component 1 @ beta] [stdout] progress: 10% 20%"]
    assert follower.read(final=True) == ["[component 1 @ beta] [stdout] last words"]


def test_a_missing_file_is_empty_until_it_appears(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    follower = OutputFollower(files)
    assert follower.read() == []
    assert follower.read(final=True) == []
    append(files.stderr, b"late\n")
    assert follower.read() == ["[stderr] late"]


def test_bytes_that_are_not_utf8_are_shown_replaced(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stdout, b"caf\xc3\xa9 \xff\xfe ok\x00end\r\n\x89PNG\r\n\x1a\n")
    lines = OutputFollower(files).read(final=True)
    assert lines == [
        "[stdout] caf\u00e9 \ufffd\ufffd ok\ufffdend",
        "[stdout] \ufffdPNG",
        "[stdout] \x1a",
    ]


def test_one_file_for_both_streams_is_read_once(tmp_path: Path) -> None:
    both = str(tmp_path / "slurm-7.out")
    append(both, b"out\nerr\n")
    assert OutputFollower(OutputFiles(both, both)).read() == ["[stdout] out", "[stdout] err"]
    assert stderr_tail(OutputFiles(both, both))[1:] == ["[output] out", "[output] err"]


def test_a_file_written_anew_is_read_from_its_start(tmp_path: Path) -> None:
    # A local job queued again after its worker died truncates its files.
    files = files_in(tmp_path)
    follower = OutputFollower(files)
    append(files.stdout, b"attempt 1 says a lot\n")
    assert follower.read() == ["[stdout] attempt 1 says a lot"]
    Path(files.stdout).write_bytes(b"attempt 2\n")
    assert follower.read() == [
        "[gridcore] stdout was written anew: reading it from its start",
        "[stdout] attempt 2",
    ]


def test_a_file_url_is_read_through_fsspec_like_a_path(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stdout, b"a\nb\n")
    append(files.stderr, b"oops\n")
    by_url = OutputFiles(f"file://{files.stdout}", f"file://{files.stderr}")
    follower = OutputFollower(by_url)
    assert follower.read() == ["[stdout] a", "[stdout] b", "[stderr] oops"]
    append(files.stdout, b"c\n")
    assert follower.read() == ["[stdout] c"]
    assert stderr_tail(by_url)[1:] == ["[stderr] oops"]


# -- bounds ----------------------------------------------------------------------------------


def test_each_read_takes_at_most_poll_bytes_and_the_end_drains(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stdout, b"".join(b"line %02d\n" % i for i in range(10)))  # 8 bytes each
    follower = OutputFollower(files, limits=OutputLimits(poll_bytes=20))

    assert follower.read() == ["[stdout] line 00", "[stdout] line 01"]  # 20 bytes read
    assert follower.read() == ["[stdout] line 02", "[stdout] line 03", "[stdout] line 04"]
    rest = follower.read(final=True)
    assert rest == [f"[stdout] line {i:02d}" for i in range(5, 10)]


def test_output_beyond_the_total_is_cut_with_a_marker_naming_the_file(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stdout, b"".join(b"line %02d\n" % i for i in range(10)))  # 80 bytes
    follower = OutputFollower(files, limits=OutputLimits(total_bytes=30))

    lines = follower.read()
    assert lines == [
        "[stdout] line 00",
        "[stdout] line 01",
        "[stdout] line 02",
        f"[gridcore] output cut: 56 more bytes in {files.stdout}",
    ]
    append(files.stdout, b"more\n" * 4)
    assert follower.read() == []  # nothing more is shown ...
    assert follower.read(final=True) == [  # ... but the end says how much was not
        f"[gridcore] stdout: 76 of its 100 bytes were not shown; all are in {files.stdout}"
    ]
    assert follower.read(final=True) == []
    assert follower.shown()["stdout"] == 24


def test_each_stream_has_its_own_bound(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stdout, b"x" * 9 + b"\n" + b"y" * 9 + b"\n")
    append(files.stderr, b"short\n")
    lines = OutputFollower(files, limits=OutputLimits(total_bytes=10)).read()
    assert lines == [
        "[stdout] xxxxxxxxx",
        f"[gridcore] output cut: 10 more bytes in {files.stdout}",
        "[stderr] short",
    ]


def test_a_long_line_comes_in_pieces(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stdout, b"a" * 25 + b"\n")
    lines = OutputFollower(files, limits=OutputLimits(line_bytes=10)).read()
    assert lines == ["[stdout] " + "a" * 10, "[stdout] " + "a" * 10, "[stdout] " + "a" * 5]


def test_a_huge_line_without_newline_is_shown_in_pieces_not_held(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stdout, b"b" * 35)
    follower = OutputFollower(files, limits=OutputLimits(line_bytes=10, poll_bytes=1000))
    assert follower.read() == ["[stdout] " + "b" * 10] * 3
    assert follower.read(final=True) == ["[stdout] bbbbb"]


def test_split_lines_keeps_the_unended_rest() -> None:
    assert split_lines(b"a\nbb\ncc", 100, last=False) == ([(b"a", 2), (b"bb", 3)], b"cc")
    assert split_lines(b"a\nbb\ncc", 100, last=True) == ([(b"a", 2), (b"bb", 3), (b"cc", 2)], b"")
    assert split_lines(b"\n\n", 100, last=False) == ([(b"", 1), (b"", 1)], b"")
    assert split_lines(b"abcd\n", 2, last=False) == ([(b"ab", 2), (b"cd", 3)], b"")
    assert split_lines(b"abcde\n", 2, last=False) == ([(b"ab", 2), (b"cd", 2), (b"e", 2)], b"")


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="poll_bytes"):
        OutputLimits(poll_bytes=0)


# -- the stderr tail of a failed job ----------------------------------------------------------


def test_the_tail_is_the_last_lines_of_stderr(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stderr, b"".join(b"err %d\n" % i for i in range(100)))
    tail = stderr_tail(files, OutputLimits(tail_lines=3))
    assert tail == [
        f"[gridcore] stderr of the job (last 3 lines, 690 bytes in {files.stderr}):",
        "[stderr] err 97",
        "[stderr] err 98",
        "[stderr] err 99",
    ]


def test_the_tail_starts_at_a_whole_line_within_its_bytes(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stderr, b"first line\nsecond\nthird\nno newline at the end")
    tail = stderr_tail(files, OutputLimits(tail_bytes=30))
    assert tail[1:] == ["[stderr] third", "[stderr] no newline at the end"]


def test_a_short_stderr_is_shown_whole(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    append(files.stderr, b"Traceback (most recent call last):\nValueError: \xffbad\n")
    assert stderr_tail(files) == [
        f"[gridcore] stderr of the job (whole, 52 bytes in {files.stderr}):",
        "[stderr] Traceback (most recent call last):",
        "[stderr] ValueError: \ufffdbad",
    ]


def test_a_missing_or_empty_stderr_says_so(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    assert stderr_tail(files) == [f"[gridcore] stderr of the job: {files.stderr} does not exist"]
    Path(files.stderr).touch()
    assert stderr_tail(files) == [f"[gridcore] stderr of the job: {files.stderr} is empty"]


# -- several jobs -------------------------------------------------------------------------------


def test_job_outputs_label_each_job_and_name_a_job_it_cannot_find_once(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    append(str(tmp_path / "a" / "stdout.txt"), b"from a\n")
    asked: list[tuple[str, str]] = []

    def files_of(site: str, job_id: str) -> OutputFiles:
        asked.append((site, job_id))
        if site == "gone":
            raise UnknownJob(site, f"job {job_id} is not known to the site")
        return files_in(tmp_path / "a")

    outputs = JobOutputs(files_of)
    jobs = [
        SiteJob("alpha", "1", "component 0 @ alpha"),
        SiteJob("gone", "2", "component 1 @ gone"),
    ]
    first = outputs.read(jobs)
    assert first == [
        "[component 0 @ alpha] [stdout] from a",
        "[component 1 @ gone] [gridcore] cannot read the output of job 2 at site gone:"
        " site gone: job 2 is not known to the site",
    ]
    assert outputs.read(jobs) == []  # said once; asked again (the site may answer later)
    assert asked == [("alpha", "1"), ("gone", "2"), ("gone", "2")]
    [entry] = outputs.as_json()
    assert entry == {
        "site": "alpha",
        "job_id": "1",
        "label": "component 0 @ alpha",
        "failed": False,
        "stdout": str(tmp_path / "a" / "stdout.txt"),
        "stderr": str(tmp_path / "a" / "stderr.txt"),
        "shown": {"stdout": 7, "stderr": 0},
    }


def test_failure_tails_are_of_the_failed_jobs_or_else_of_all(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        append(str(tmp_path / name / "stderr.txt"), f"{name} died\n".encode())
    entries = [
        {"label": f"component {i} @ s", "failed": i == 1, **files_in(tmp_path / n).as_json()}
        for i, n in enumerate("ab")
    ]
    assert [line for line in failure_tails(entries) if "[stderr]" in line] == [
        "[component 1 @ s] [stderr] b died"
    ]
    for entry in entries:
        entry["failed"] = False
    assert [line for line in failure_tails(entries) if "[stderr]" in line] == [
        "[component 0 @ s] [stderr] a died",
        "[component 1 @ s] [stderr] b died",
    ]
    assert failure_tails([{"label": "", "stdout": 3}]) == []  # names no files


# -- the sites say where the files are -------------------------------------------------------


def test_a_local_job_writes_where_the_local_site_says(db_url: str) -> None:
    runtime = GridRuntime.open(db_url=db_url)
    try:
        record = runtime.select(JobRequest("t.out.0", 1, runtime_s=1))
        command = "printf 'hello\\nworld\\n'; echo 'bad news' >&2; exit 4"
        record = runtime.submit(record.selection_id, JobSubmission("t.out.0", command, 1))
        deadline = time.monotonic() + 30
        while not (record := runtime.poll(record.selection_id)).finished:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert record.job_id is not None
        files = runtime.output_files(record.site, record.job_id)
    finally:
        runtime.store.dispose()
    assert Path(files.stdout).name == "stdout.txt"
    assert Path(files.stderr).name == "stderr.txt"
    assert OutputFollower(files).read(final=True) == [
        "[stdout] hello",
        "[stdout] world",
        "[stderr] bad news",
    ]
    assert stderr_tail(files)[-1] == "[stderr] bad news"


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as sess:
        yield sess


def slurm_job(**fields: object) -> dict[str, object]:
    job = {
        "job_id": 1207,
        "name": "ens.member.3",
        "user_name": "root",
        "batch_host": "alpha-n1",
        "current_working_directory": "/data/alpha",
        "standard_output": "/data/alpha/ens.member.3-%j.out",
        "standard_error": "/data/alpha/ens.member.3-%j.err",
        **fields,
    }
    return body(jobs=[job])


def test_a_slurm_job_writes_where_it_was_submitted_to_write(session: requests.Session) -> None:
    site, _ = make_site(session, {("GET", "/job/1207"): (200, slurm_job())})
    assert site.output_files("1207") == OutputFiles(
        "/data/alpha/ens.member.3-1207.out", "/data/alpha/ens.member.3-1207.err"
    )


def test_slurm_defaults_and_relative_paths(session: requests.Session) -> None:
    # No paths at submission: sbatch's default, both streams in slurm-<id>.out in the cwd;
    # a relative path is relative to the job's working directory.
    replies = {
        ("GET", "/job/1207"): (200, slurm_job(standard_output="", standard_error="")),
        ("GET", "/job/1208"): (
            200,
            slurm_job(job_id=1208, standard_output="logs/%x.%j.out", standard_error=None),
        ),
    }
    site, _ = make_site(session, replies)
    assert site.output_files("1207") == OutputFiles(
        "/data/alpha/slurm-1207.out", "/data/alpha/slurm-1207.out"
    )
    assert site.output_files("1208") == OutputFiles(
        "/data/alpha/logs/ens.member.3.1208.out", "/data/alpha/logs/ens.member.3.1208.out"
    )


def test_slurm_files_on_sftp_storage_are_urls_on_its_host(session: requests.Session) -> None:
    site, _ = make_site(
        session,
        {("GET", "/job/1207"): (200, slurm_job())},
        storage_dir="sftp://gc@login.alpha:2222/data/alpha",
    )
    assert site.output_files("1207").stderr == (
        "sftp://gc@login.alpha:2222/data/alpha/ens.member.3-1207.err"
    )


def test_slurm_forgot_the_job(session: requests.Session) -> None:
    site, _ = make_site(session, {("GET", "/job/1207"): (200, body(jobs=[]))})
    with pytest.raises(UnknownJob):
        site.output_files("1207")


@pytest.mark.parametrize(
    ("pattern", "expanded"),
    [
        ("/w/%x-%j.out", "/w/ens.member.3-1207.out"),
        ("/w/%8j.%u.%N", "/w/00001207.root.alpha-n1"),
        ("/w/100%%-%A_%a", "/w/100%-1207_0"),
        ("/w/plain.out", "/w/plain.out"),
        ("/w/%q", "/w/%q"),  # not a pattern letter: kept as written
    ],
)
def test_slurm_filename_patterns(pattern: str, expanded: str) -> None:
    job = {"job_id": 1207, "name": "ens.member.3", "user_name": "root", "batch_host": "alpha-n1"}
    assert expand_filename_pattern(pattern, job) == expanded
