"""``gridcore submit`` run in-process (gridcore.cli.main) on the embedded local sites,
with every state under ``tmp_path`` (the ``db_url`` fixture). The jobs are real local
subprocesses of a few milliseconds; the poll intervals are shortened, not slept out."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gridcore import submit
from gridcore.cli import main
from gridcore.engine import health
from gridcore.engine.runtime import GridRuntime, JobRecord
from gridcore.errors import ConfigError, CredentialRejected, RequestError, SiteUnavailable
from gridcore.model import JobRequest, JobState, JobUsage
from gridcore.state.schema import selections
from gridcore.state.store import open_store
from tests.fakes import FaultySite

JSON_KEYS = {
    "site",
    "job_id",
    "selection_id",
    "state",
    "exit_code",
    "message",
    "release",
    "api_version",
    "stdout",
    "stderr",
    "resources",
    "reasons",
    "usage",
}


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submit, "POLL_FIRST_S", 0.02)
    monkeypatch.setattr(submit, "POLL_EVERY_S", 0.05)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["submit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, "--json", *argv)
    return code, json.loads(out), err


def selection_count(db_url: str) -> int:
    store = open_store(db_url)
    try:
        with store.begin() as conn:
            return int(conn.execute(select(func.count()).select_from(selections)).scalar_one())
    finally:
        store.dispose()


# -- submitting -----------------------------------------------------------------------


def test_submit_without_wait_prints_the_job_its_site_and_why(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--processors", "2", "--", "true")
    assert code == 0
    first, *why = out.splitlines()
    assert first == "submitted job 1 on site local-a (selection 1): pending"
    assert why[0] == "  local-a: earliest estimated completion among 3"
    assert selection_count(db_url) == 1


def test_wait_streams_the_output_and_exits_with_the_jobs_code(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "--processors", "1", "--wait", "--", "sh", "-c", "echo hello; echo oops >&2; exit 3"
    )
    assert code == 3
    lines = out.splitlines()
    assert "[stdout] hello" in lines
    assert "[stderr] oops" in lines
    assert lines[-1] == "job 1 on site local-a (selection 1): failed, exit code 3"


def test_wait_for_a_completed_job_exits_0(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--processors", "1", "--wait", "--", "echo", "two words")
    assert code == 0
    assert "[stdout] two words" in out.splitlines()  # the words arrive as given


def test_json_is_one_object_on_stdout_and_the_rest_goes_to_stderr(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data, err = run_json(
        capsys, "--processors", "1", "--wait", "--", "sh", "-c", "echo hello; exit 3"
    )
    assert code == 3
    assert set(data) == JSON_KEYS
    assert data["site"] == "local-a"
    assert (data["state"], data["exit_code"]) == ("failed", 3)
    assert (data["job_id"], data["selection_id"]) == ("1", 1)
    assert (data["release"], data["api_version"], data["usage"]) == (None, None, None)
    assert data["reasons"][0] == "local-a: earliest estimated completion among 3"
    assert Path(data["stdout"]).read_text() == "hello\n"
    assert data["stderr"].endswith("stderr.txt")
    assert "[stdout] hello" in err.splitlines()


def test_json_resources_are_what_was_sent_over_the_sites_defaults(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(
        "version = 1\n"
        "[sites.lab]\nkind = 'local'\nprocessors = 2\n"
        "[sites.lab.defaults]\ntime_limit = '1h'\naccount = 'proj42'\n"
    )
    code, data, _ = run_json(
        capsys, "--grid", str(grid), "--processors", "1", "--memory", "1G", "--", "true"
    )
    assert code == 0
    assert data["resources"] == {
        "time_limit_s": 3600,
        "account": "proj42",
        "memory_mib": 1024,
        "memory_per": "node",
    }


# -- where: pinned, or among several ----------------------------------------------------


def test_one_site_pins_the_job_there(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, data, _ = run_json(capsys, "--site", "local-c", "--processors", "1", "--", "true")
    assert code == 0
    assert data["site"] == "local-c"
    assert data["reasons"] == ["site local-c: pinned by the request (4 effective idle when read)"]


def test_several_sites_restrict_the_policys_choice(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # among all three the policy takes local-a (fastest); among b and c, b (faster)
    code, data, _ = run_json(
        capsys, "--site", "local-c", "--site", "local-b", "--processors", "1", "--", "true"
    )
    assert code == 0
    assert data["site"] == "local-b"
    assert data["reasons"][0] == "local-b: earliest estimated completion among 2"


def test_select_among_refuses_unknown_and_contradicting_sites(tmp_path: Path) -> None:
    from gridcore.config import default_grid

    rt = GridRuntime(default_grid(tmp_path), open_store(f"sqlite:///{tmp_path}/s.db", upgrade=True))
    try:
        with pytest.raises(ConfigError, match="unknown site 'nowhere'"):
            rt.select(JobRequest("j", 1), among=["local-a", "nowhere"])
        with pytest.raises(RequestError, match="'local-a' is pinned, but not among"):
            rt.select(JobRequest("j", 1), site="local-a", among=["local-b"])
        assert rt.select(JobRequest("j", 1), among=["local-c"]).site == "local-c"
    finally:
        rt.store.dispose()


# -- --test-only ----------------------------------------------------------------------


def test_test_only_says_where_and_how_soon_and_records_nothing(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """sbatch --test-only's twin: the site the policy would choose now, each site's
    estimate with the wait model's forecast; no selection, no job. The next real
    submission goes where it said."""
    code, out, _ = run(capsys, "--test-only", "--processors", "2", "--", "true")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "would run on site local-a (fit)"
    assert lines[1] == "  local-a: earliest estimated completion among 3"
    b = next(line for line in lines if line.startswith("  site local-b:"))
    assert b.startswith("  site local-b: queue delay 0 s by predicted_backfill (backfill with")
    assert b.endswith("no residual yet in its bin), completion 720 s")
    code, data, _ = run_json(capsys, "--test-only", "--processors", "3", "--", "true")
    assert code == 0 and set(data) == {"site", "outcome", "reasons", "sites"}
    assert (data["site"], data["outcome"]) == ("local-a", "fit")
    assert set(data["sites"]) == {"local-a", "local-b", "local-c"}
    a = data["sites"]["local-a"]
    assert a["fits"] is True and a["wait_model"]["predictor"] == "predicted_backfill"
    assert a["wait_model"]["wait_s"] == a["queue_delay_s"] == 0.0
    assert selection_count(db_url) == 0
    # local-a's eight processors in flight: it no longer fits there, and a real
    # submission then goes where --test-only says
    assert run(capsys, "--site", "local-a", "--processors", "8", "--", "sleep", "5")[0] == 0
    code, said, _ = run_json(capsys, "--test-only", "--processors", "3", "--", "true")
    assert code == 0 and said["sites"]["local-a"]["fits"] is False
    assert said["site"] != "local-a"
    code, done, _ = run_json(capsys, "--processors", "3", "--", "true")
    assert code == 0 and done["site"] == said["site"]
    assert selection_count(db_url) == 2
    # a size only local-a has: the sites that would refuse it are not candidates
    code, big, _ = run_json(capsys, "--test-only", "--processors", "6", "--", "true")
    assert code == 0 and set(big["sites"]) == {"local-a"}


def test_test_only_with_a_pinned_site_answers_as_the_pinned_submission(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pinned job goes to its site whatever that site's health, and --test-only says
    so; it leaves the health as it was (no probe job sent to the unusable site)."""
    assert run(capsys, "--test-only", "--processors", "1", "--", "true")[0] == 0  # the sites
    store = open_store(db_url)
    try:
        with store.begin() as conn:
            for _ in range(health.UNUSABLE_AFTER_ERRORS):
                health.record_failure(conn, "local-c", "component failed")
    finally:
        store.dispose()
    code, data, _ = run_json(
        capsys, "--test-only", "--site", "local-c", "--processors", "1", "--", "true"
    )
    assert code == 0 and (data["site"], data["outcome"]) == ("local-c", "fit")
    assert data["reasons"] == ["site local-c: pinned by the request (4 effective idle when read)"]
    assert selection_count(db_url) == 0
    store = open_store(db_url)
    try:
        with store.begin() as conn:
            record = health.read_health(conn)["local-c"]
    finally:
        store.dispose()
    assert not record.usable and record.probe_job_id is None
    code, real, _ = run_json(capsys, "--site", "local-c", "--processors", "1", "--", "true")
    assert code == 0 and real["site"] == "local-c" and real["reasons"] == data["reasons"]


# -- time limit, Ctrl-C ------------------------------------------------------------------


def test_a_local_site_enforces_the_time_limit(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data, _ = run_json(
        capsys, "--processors", "1", "--time-limit", "1s", "--wait", "--", "sleep", "30"
    )
    assert code == 1  # failed without an exit code
    assert (data["state"], data["exit_code"]) == ("failed", None)
    assert data["message"].startswith("time limit of 1 s exceeded")
    assert data["resources"] == {"time_limit_s": 1}


def test_ctrl_c_while_waiting_cancels_the_job_and_exits_130(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_poll = GridRuntime.poll

    def interrupted_once_running(rt: GridRuntime, selection_id: int) -> JobRecord:
        record = real_poll(rt, selection_id)
        if record.state == JobState.RUNNING.value:
            raise KeyboardInterrupt
        return record

    monkeypatch.setattr(GridRuntime, "poll", interrupted_once_running)
    code, data, err = run_json(capsys, "--processors", "1", "--wait", "--", "sleep", "30")
    assert code == submit.INTERRUPTED == 130
    assert data["state"] == "cancelled"
    assert err.splitlines()[-1] == (
        "gridcore: interrupted: cancelled job 1 on site local-a (selection 1): cancelled"
    )


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--processors", "1"], "command:"),
        (["--processors", "1", "--"], "command:"),
        (["--processors", "0", "--", "true"], "request.processors:"),
        (["--processors", "two", "--", "true"], "request.processors:"),
        (["--processors", "1", "--site", "nowhere", "--", "true"], "site: unknown site"),
        (["--site", "local-a", "--site", "x", "--processors", "1", "--", "true"], "site:"),
        (["--processors", "1", "--time-limit", "10x", "--", "true"], "time_limit: '10x'"),
        (["--processors", "1", "--memory", "4Q", "--", "true"], "memory: '4Q'"),
        (
            ["--processors", "1", "--memory", "1G", "--memory-per-cpu", "1G", "--", "true"],
            "memory_per_cpu:",
        ),
        (["--processors", "1", "--gpus", "1", "--", "true"], "gpus: asks for 1 GPU(s)"),
        (["--processors", "1", "--env", "NOEQUALS", "--", "true"], "env: 'NOEQUALS'"),
        (["--processors", "1", "--env", "1X=2", "--", "true"], "job.env.1X:"),
        (["--processors", "1", "--name", " ", "--", "true"], "request.name:"),
        (["--test-only", "--wait", "--processors", "1", "--", "true"], "--test-only"),
    ],
)
def test_bad_input_exits_2_naming_the_field_and_writes_nothing(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], field: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"gridcore: error: {field}")
    assert not (tmp_path / "state.db").exists()  # the state database was not even opened


def test_a_rejected_credential_exits_1_in_one_line(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = CredentialRejected("local-a", "credential env:TOKEN refused (HTTP 401)")
    with_faults(monkeypatch, submit_error=refused)
    code, out, err = run(capsys, "--site", "local-a", "--processors", "1", "--", "true")
    assert code == 1
    assert out == ""
    assert err == "gridcore: error: site local-a: credential env:TOKEN refused (HTTP 401)\n"


def test_a_site_lost_while_waiting_exits_1_naming_the_selection(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(submit, "RETRY_CAP_S", 0.01)
    with_faults(monkeypatch, status_error=SiteUnavailable("local-a", "connection refused"))
    code, out, err = run(capsys, "--site", "local-a", "--processors", "1", "--wait", "--", "true")
    assert code == 1
    assert out.startswith("submitted job 1 on site local-a (selection 1)")
    assert err == "gridcore: error: selection 1: site local-a: connection refused\n"


def test_usage_is_the_sites_accounting_of_the_finished_job(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_faults(monkeypatch, accounted=JobUsage(2.0, 1.5, 1, 4096))
    code, data, _ = run_json(capsys, "--processors", "1", "--wait", "--", "true")
    assert code == 0
    assert data["usage"] == {
        "elapsed_s": 2.0,
        "cpu_time_s": 1.5,
        "cpus": 1,
        "max_rss_bytes": 4096,
        "cpu_efficiency": 0.75,
    }


class AccountedSite(FaultySite):
    """A local site whose finished jobs carry accounting figures, as Slurm's do."""

    def __init__(self, inner: Any, usage: JobUsage | None, **faults: Any) -> None:
        super().__init__(inner, **faults)
        self.usage = usage

    def status(self, job_id: str) -> Any:
        status = super().status(job_id)
        return replace(status, usage=self.usage) if status.state.finished else status


def with_faults(
    monkeypatch: pytest.MonkeyPatch, accounted: JobUsage | None = None, **faults: Any
) -> None:
    """Every adapter the CLI's runtime builds, wrapped in :class:`AccountedSite`."""
    build = GridRuntime._build_adapter

    def wrapped(rt: GridRuntime, spec: Any) -> Any:
        return AccountedSite(build(rt, spec), accounted, **faults)

    monkeypatch.setattr(GridRuntime, "_build_adapter", wrapped)
