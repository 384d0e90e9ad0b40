"""Malformed inputs (issue 7: "more than 1 in 5 malformed inputs is not refused cleanly"),
one table shared by the SQLite tier (tests/unit/test_malformed_inputs.py) and the
PostgreSQL tier (tests/postgres/test_malformed_inputs_pg.py).

Each refusal must be one line naming the file (grid files) and the field, raised before
anything is written: the checks compare every row of every table before and after, and
the capacity ledger's invariant and site counters after.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from sqlalchemy import MetaData, select

from gridcore.config import default_grid
from gridcore.engine.coallocation import CoAllocationEngine
from gridcore.engine.runtime import GridRuntime
from gridcore.errors import ConfigError, RequestError
from gridcore.model import (
    CoAllocationRequest,
    Component,
    FlexibleOptions,
    InputFile,
    JobRequest,
    JobResources,
    JobSubmission,
    RequestKind,
)
from gridcore.policies.claiming import CoAllocationParams
from gridcore.policies.placement import PlacementPolicy
from gridcore.staging import ReplicaCatalog
from gridcore.state.capacity import check_invariant
from gridcore.state.schema import local_jobs, sites
from gridcore.state.store import Store, open_store
from tests.barrier_checks import running_center

# -- grid description files -------------------------------------------------------------

LOCAL = 'version = 1\n\n[sites.a]\nkind = "local"\nprocessors = 4\n'
SLURM = (
    'version = 1\n\n[sites.a]\nkind = "slurm"\nprocessors = 4\nurl = "http://127.0.0.1:6820"\n'
    'token = { env = "A_TOKEN" }\n'
)


@dataclass(frozen=True)
class GridCase:
    """``write(path)`` makes ``path`` a malformed grid; the one-line message (after the
    file name) must match ``message``."""

    id: str
    write: Callable[[Path], None]
    message: str

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def _text(content: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(content, encoding="utf-8")


def _bytes(content: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(content)


def _site(extra: str, base: str = LOCAL) -> Callable[[Path], None]:
    return _text(base + extra + "\n")


def _replace(old: str, new: str, base: str = LOCAL) -> Callable[[Path], None]:
    assert old in base
    return _text(base.replace(old, new))


LONG_SITE = "s" * 65
GRID_CASES = [
    GridCase(
        "non-UTF-8 file",
        _bytes(LOCAL.encode() + b'# caf\xe9 = "latin-1"\n'),
        r"not UTF-8 text \(byte 0xe9 at offset \d+\)$",
    ),
    GridCase(
        "binary file",
        _bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256))),
        r"a binary file \(NUL bytes\), not a TOML grid description$",
    ),
    GridCase("grid path is a directory", lambda path: path.mkdir(), r"is a directory"),
    GridCase("not TOML", _text("version = \n"), r"not valid TOML: "),
    GridCase(
        "infinite storage",
        _site("storage_gb = inf"),
        r"sites\.a\.storage_gb: must be a finite number of GB > 0 .*, got inf$",
    ),
    GridCase(
        "storage beyond the byte column",
        _site("storage_gb = 1e20"),
        r"sites\.a\.storage_gb: must be a finite number of GB > 0 and at most 9223372036,"
        r" got 1e\+20$",
    ),
    GridCase(
        "infinite bandwidth",
        _site("\n[bandwidth]\norigin = { a = inf }"),
        r"bandwidth\.origin\.a: must be a finite number > 0, got inf$",
    ),
    GridCase(
        "NaN bandwidth",
        _site("\n[bandwidth]\norigin = { a = nan }"),
        r"bandwidth\.origin\.a: must be a finite number > 0, got nan$",
    ),
    GridCase(
        "infinite default bandwidth",
        _text(LOCAL.replace("version = 1\n", "version = 1\ndefault_bandwidth_mbps = inf\n")),
        r"default_bandwidth_mbps: must be a finite number > 0, got inf$",
    ),
    GridCase(
        "infinite slowness",
        _site("slowness = inf"),
        r"sites\.a\.slowness: must be a finite number > 0, got inf$",
    ),
    GridCase(
        "infinite timeout",
        _site("timeout_s = inf", base=SLURM),
        r"sites\.a\.timeout_s: must be a finite number > 0, got inf$",
    ),
    GridCase(
        "processors beyond the integer column",
        _replace("processors = 4", "processors = 2147483648"),
        r"sites\.a\.processors: must be a positive integer \(at most 2147483647\),"
        r" got 2147483648$",
    ),
    GridCase(
        "processors 1e99",
        _replace("processors = 4", "processors = 1e99"),
        r"sites\.a\.processors: must be a positive integer \(at most 2147483647\), got 1e\+99$",
    ),
    GridCase(
        "processors a float",
        _replace("processors = 4", "processors = 4.0"),
        r"sites\.a\.processors: must be a positive integer .*, got 4\.0$",
    ),
    GridCase(
        "processors a boolean",
        _replace("processors = 4", "processors = true"),
        r"sites\.a\.processors: must be a positive integer .*, got True$",
    ),
    GridCase(
        "processors a string",
        _replace("processors = 4", 'processors = "4"'),
        r"sites\.a\.processors: must be a positive integer .*, got '4'$",
    ),
    GridCase(
        "site name longer than its column",
        _replace("[sites.a]", f"[sites.{LONG_SITE}]"),
        r'sites\."s{37}\.\.\.": must be at most 64 characters, got a string of 65 characters',
    ),
    GridCase(
        "site name with a space",
        _replace("[sites.a]", '[sites."a b"]'),
        r'sites\."a b": site name must be letters, digits, - or _, got \'a b\'$',
    ),
    GridCase(
        "version = true",
        _replace("version = 1", "version = true"),
        r"version: must be 1, got True$",
    ),
    GridCase(
        "version = 1.0", _replace("version = 1", "version = 1.0"), r"version: must be 1, got 1\.0$"
    ),
    GridCase(
        "storage_dir escaping with ..",
        _site('storage_dir = "/srv/grid/../../etc"'),
        r"sites\.a\.storage_dir: must not contain '\.\.' \(it would escape the directory\)",
    ),
    GridCase(
        "storage_dir with a NUL byte",
        _site('storage_dir = "/srv/grid\\u0000x"'),
        r"sites\.a\.storage_dir: must not contain a NUL byte$",
    ),
    GridCase(
        "unknown origin site in the bandwidth matrix",
        _site("\n[bandwidth]\nelsewhere = { a = 10.0 }"),
        r"bandwidth\.elsewhere: unknown site \(known: a, origin\)$",
    ),
    GridCase(
        "unknown destination site in the bandwidth matrix",
        _site("\n[bandwidth]\norigin = { b = 10.0 }"),
        r"bandwidth\.origin\.b: unknown site \(known: a, origin\)$",
    ),
    GridCase(
        "slurm URL not http(s)",
        _replace('url = "http://127.0.0.1:6820"', 'url = "file:///etc/passwd"', base=SLURM),
        r"sites\.a\.url: slurm sites need an http\(s\) slurmrestd URL, got 'file:///etc/passwd'$",
    ),
    GridCase(
        "a token written in the file",
        _replace('token = { env = "A_TOKEN" }', 'token = "s3cret"', base=SLURM),
        r"sites\.a\.token: must be a reference .* never the token itself$",
    ),
    GridCase("unknown key", _site("cpus = 4"), r"sites\.a\.cpus: unknown key$"),
    GridCase(
        "a misspelt key (issue 21 item 6): the key, not 'processors: is required'",
        _replace("processors = 4", "procesors = 4"),
        r'sites\.a\.procesors: unknown key \(did you mean "processors"\?\)$',
    ),
    GridCase(
        "a misspelt key in a site's defaults",
        _site('defaults = { time_limt = "1h" }'),
        r'sites\.a\.defaults\.time_limt: unknown key \(did you mean "time_limit"\?\)$',
    ),
    GridCase(
        "a misspelt credential reference",
        _replace('token = { env = "A_TOKEN" }', 'token = { evn = "A_TOKEN" }', base=SLURM),
        r'sites\.a\.token\.evn: unknown key \(did you mean "env"\?\)$',
    ),
    GridCase(
        "a site's default time limit not a duration",
        _site('defaults = { time_limit = "forever" }'),
        r"sites\.a\.defaults\.time_limit: 'forever' is not a duration \(use 90s, 10m, 2h,",
    ),
    GridCase(
        "an unknown key in a site's defaults",
        _site("[sites.a.defaults]\nwalltime = 60"),
        r"sites\.a\.defaults\.walltime: unknown key \(known: time_limit, account, qos,",
    ),
    GridCase(
        "GPUs by default on a local site",
        _site("defaults = { gpus = 1 }"),
        r"sites\.a\.defaults\.gpus: a local site has no GPUs$",
    ),
]


def written(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (the migrated schema as it is, whoever added tables)."""
    meta = MetaData()
    with store.begin() as conn:
        meta.reflect(bind=conn)
        return {
            name: sorted(tuple(map(repr, row)) for row in conn.execute(select(table)))
            for name, table in sorted(meta.tables.items())
        }


def assert_nothing_claimed(store: Store) -> None:
    with store.begin() as conn:
        assert check_invariant(conn) == []
        counters = conn.execute(select(sites.c.name, sites.c.claimed, sites.c.queued)).all()
    assert all(claimed == 0 and queued == 0 for _, claimed, queued in counters), counters


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDCORE_")}
    env["GRIDCORE_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "gridcore.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def check_grid_case(case: GridCase, db_url: str, tmp_path: Path) -> None:
    """The CLI exits 2 with one stderr line naming file and field; the API raises the
    same ConfigError; the state database is untouched."""
    store = open_store(db_url, upgrade=True)
    try:
        before = written(store)
        path = tmp_path / "grid.toml"
        case.write(path)
        done = run_cli("sites", "--no-refresh", "--grid", str(path), "--db", db_url, home=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        prefix = f"gridcore: error: {path}: "
        assert lines[0].startswith(prefix), lines[0]
        assert re.search(case.message, lines[0][len(prefix) :]), lines[0]
        with pytest.raises(ConfigError) as refused:
            GridRuntime.open(str(path), db_url)
        assert str(refused.value) == lines[0].removeprefix("gridcore: error: ")
        assert written(store) == before
        assert_nothing_claimed(store)
    finally:
        store.dispose()


# -- requests for site selection (GridRuntime.select) ------------------------------------


@dataclass(frozen=True)
class SelectCase:
    id: str
    request: JobRequest
    message: str
    site: str | None = None
    stream: Any = "default"

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


SELECT_CASES = [
    SelectCase(
        "processors a float",
        JobRequest("j", 2.0),  # type: ignore[arg-type]
        r"^request\.processors: must be a positive integer \(at most 2147483647\), got 2\.0$",
    ),
    SelectCase(
        "processors a string",
        JobRequest("j", "2"),  # type: ignore[arg-type]
        r"^request\.processors: must be a positive integer .*, got '2'$",
    ),
    SelectCase(
        "processors a boolean",
        JobRequest("j", True),
        r"^request\.processors: must be a positive integer .*, got True$",
    ),
    SelectCase(
        "processors beyond the integer column",
        JobRequest("j", 2**31),
        r"^request\.processors: must be a positive integer .*, got 2147483648$",
    ),
    SelectCase(
        "processors a float, pinned site",
        JobRequest("j", 1.5),  # type: ignore[arg-type]
        r"^request\.processors: must be a positive integer .*, got 1\.5$",
        site="local-a",
    ),
    SelectCase(
        "infinite runtime",
        JobRequest("j", 1, runtime_s=math.inf),
        r"^request\.runtime_s: must be a finite number >= 0, got inf$",
    ),
    SelectCase(
        "NaN runtime",
        JobRequest("j", 1, runtime_s=math.nan),
        r"^request\.runtime_s: must be a finite number >= 0, got nan$",
    ),
    SelectCase(
        "input bytes a float",
        JobRequest("j", 1, input_bytes=1.5),  # type: ignore[arg-type]
        r"^request\.input_bytes: must be a byte count, an integer between 0 and"
        r" 9223372036854775807, got 1\.5$",
    ),
    SelectCase(
        "output bytes beyond the BigInteger range",
        JobRequest("j", 1, output_bytes=2**63),
        r"^request\.output_bytes: must be a byte count.*, got 9223372036854775808$",
    ),
    SelectCase(
        "name longer than its column",
        JobRequest("n" * 257, 1),
        r"^request\.name: must be at most 256 characters, got a string of 257 characters",
    ),
    SelectCase(
        "name with a NUL byte",
        JobRequest("a\x00b", 1),
        r"^request\.name: must not be blank or contain control characters, got 'a\\x00b'$",
    ),
    SelectCase("empty name", JobRequest("", 1), r"^request\.name: must not be empty, got ''$"),
    SelectCase(
        "unknown origin site",
        JobRequest("j", 1, input_bytes=10, origin="elsewhere"),
        r"^request\.origin: unknown site 'elsewhere' \(known: local-a, local-b, local-c,"
        r" origin\)$",
    ),
    SelectCase(
        "stream longer than its column",
        JobRequest("j", 1),
        r"^stream: must be at most 128 characters, got a string of 129 characters",
        stream="s" * 129,
    ),
]


def check_select_case(case: SelectCase, db_url: str, tmp_path: Path) -> None:
    rt = GridRuntime(default_grid(tmp_path), open_store(db_url, upgrade=True))
    try:
        before = written(rt.store)
        with pytest.raises(RequestError, match=case.message):
            rt.select(case.request, stream=case.stream, site=case.site, max_age_s=math.inf)
        assert written(rt.store) == before
        assert_nothing_claimed(rt.store)
    finally:
        rt.store.dispose()


# -- co-allocation requests (CoAllocationEngine.submit) -----------------------------------------


@dataclass(frozen=True)
class SubmitCase:
    id: str
    request: CoAllocationRequest
    message: str
    command: Any = "true"
    quota: Any = None
    policy: Any = PlacementPolicy.CM

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def _sized(*sizes: Any, name: str = "j") -> CoAllocationRequest:
    return CoAllocationRequest(name, RequestKind.NON_FIXED, tuple(Component(s) for s in sizes))


OK = _sized(2, 2)
SUBMIT_CASES = [
    SubmitCase(
        "a name that leaves no room for the components' #i",
        _sized(2, 2, name="n" * 255),
        r"^request\.name: must be at most 254 characters: each component's site job is named"
        r" NAME#i \(up to #1\), got 255$",
    ),
    SubmitCase(
        "size a float",
        _sized(2, 2.0),
        r"^request\.components\[1\]\.size: must be a positive integer .*, got 2\.0$",
    ),
    SubmitCase(
        "size a string",
        _sized("2"),
        r"^request\.components\[0\]\.size: must be a positive integer .*, got '2'$",
    ),
    SubmitCase(
        "size a boolean",
        _sized(True),
        r"^request\.components\[0\]\.size: must be a positive integer .*, got True$",
    ),
    SubmitCase(
        "size beyond the integer column",
        _sized(2**31),
        r"^request\.components\[0\]\.size: must be a positive integer .*, got 2147483648$",
    ),
    SubmitCase(
        "flexible total a float",
        CoAllocationRequest("j", RequestKind.FLEXIBLE, total=4.0),  # type: ignore[arg-type]
        r"^request\.total: must be an integer between 0 and 2147483647, got 4\.0$",
    ),
    SubmitCase(
        "flexible split part a string",
        CoAllocationRequest(
            "j", RequestKind.FLEXIBLE, total=4, flexible=FlexibleOptions(splits=((2, "2"),))
        ),
        r"^request\.flexible\.splits\[0\]\[1\]: must be a positive integer .*, got '2'$",
    ),
    SubmitCase(
        "name longer than its column",
        _sized(2, name="n" * 300),
        r"^request\.name: must be at most 256 characters, got a string of 300 characters",
    ),
    SubmitCase(
        "fixed component on an unknown site",
        CoAllocationRequest("j", RequestKind.FIXED, (Component(2, "nowhere"),)),
        r"^request\.components\[0\]\.site: unknown site 'nowhere' \(known: local-a, local-b,"
        r" local-c\)$",
    ),
    SubmitCase(
        "fixed component site longer than its column",
        CoAllocationRequest("j", RequestKind.FIXED, (Component(2, "x" * 65),)),
        r"^request\.components\[0\]\.site: must be at most 64 characters",
    ),
    SubmitCase(
        "input file name longer than its column",
        CoAllocationRequest(
            "j", RequestKind.NON_FIXED, (Component(2),), input_file=InputFile("f" * 513)
        ),
        r"^request\.input_file\.logical_name: must be at most 512 characters",
    ),
    SubmitCase(
        "input file name escaping with ..",
        CoAllocationRequest(
            "j", RequestKind.NON_FIXED, (Component(2),), input_file=InputFile("../etc/passwd")
        ),
        r"^request\.input_file\.logical_name: must be a relative path of non-empty segments",
    ),
    SubmitCase(
        "priority not a priority",
        CoAllocationRequest("j", RequestKind.NON_FIXED, (Component(2),), priority="urgent"),  # type: ignore[arg-type]
        r"^request\.priority: must be high \| low, got 'urgent'$",
    ),
    SubmitCase("blank command", OK, r"^command: must not be blank", command="  "),
    SubmitCase(
        "command with a NUL byte",
        OK,
        r"^command: must not be blank or contain a NUL byte",
        command="true\x00",
    ),
    SubmitCase(
        "command not a string",
        OK,
        r"^command: must be a string, got a list of 1$",
        command=["true"],
    ),
    SubmitCase("quota a boolean", OK, r"^quota: must be in \(0, 1\], got True$", quota=True),
    SubmitCase("quota a string", OK, r"^quota: must be in \(0, 1\], got '0\.5'$", quota="0.5"),
    SubmitCase("quota infinite", OK, r"^quota: must be in \(0, 1\], got inf$", quota=math.inf),
    SubmitCase("quota NaN", OK, r"^quota: must be in \(0, 1\], got nan$", quota=math.nan),
    SubmitCase(
        "unknown policy", OK, r"^policy: must be WF \| CF \| CM \| FCM, got 'XX'$", policy="XX"
    ),
]


def check_submit_case(case: SubmitCase, db_url: str, tmp_path: Path) -> None:
    rt = GridRuntime(default_grid(tmp_path), open_store(db_url, upgrade=True))
    try:
        with running_center(rt.store) as center:
            params = CoAllocationParams(scan_interval_s=1.0)
            koala = CoAllocationEngine(rt, ReplicaCatalog(rt.store), params, center_url=center)
            before = written(rt.store)
            with pytest.raises(RequestError, match=case.message):
                koala.submit(case.request, case.policy, case.command, case.quota)
            assert written(rt.store) == before
            assert_nothing_claimed(rt.store)
    finally:
        rt.store.dispose()


# -- what a site runs (GridRuntime.submit, after a selection claimed processors) ---------


@dataclass(frozen=True)
class JobCase:
    id: str
    job: JobSubmission
    message: str

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


JOB_CASES = [
    JobCase(
        "command with a NUL byte",
        JobSubmission("j", "true\x00rm -rf /", 1),
        r"^job\.command: must not be blank or contain a NUL byte",
    ),
    JobCase(
        "environment value with a NUL byte",
        JobSubmission("j", "true", 1, env=MappingProxyType({"A": "x\x00"})),
        r"^job\.env\.A: must be a string of at most 131072 characters without a NUL byte",
    ),
    JobCase(
        "environment name with '='",
        JobSubmission("j", "true", 1, env=MappingProxyType({"A=B": "x"})),
        r'^job\.env\."A=B": must be an environment variable name',
    ),
    JobCase(
        "processors a float",
        JobSubmission("j", "true", 1.0),  # type: ignore[arg-type]
        r"^job\.processors: must be a positive integer .*, got 1\.0$",
    ),
    JobCase(
        "workdir with a NUL byte",
        JobSubmission("j", "true", 1, workdir="/tmp/a\x00b"),
        r"^job\.workdir: must not contain a NUL byte",
    ),
    JobCase(
        "a zero time limit",
        JobSubmission("j", "true", 1, resources=JobResources(time_limit_s=0)),
        r"^job\.resources\.time_limit: must be from 1 second to 2147483647 seconds, got 0$",
    ),
    JobCase(
        "GPUs at a local site",
        JobSubmission("j", "true", 1, resources=JobResources(gpus=1)),
        r"asks for 1 GPU\(s\); a local site has no GPUs$",
    ),
]


def check_job_case(case: JobCase, db_url: str, tmp_path: Path) -> None:
    """The selection fails with the one-line refusal and gives its processors back; no
    site job exists."""
    rt = GridRuntime(default_grid(tmp_path), open_store(db_url, upgrade=True))
    try:
        selected = rt.select(JobRequest("j", 1), max_age_s=math.inf)
        with pytest.raises(RequestError, match=case.message):
            rt.submit(selected.selection_id, case.job)
        record = rt.record(selected.selection_id)
        assert (record.state, record.job_id) == ("failed", None)
        assert re.search(case.message.lstrip("^"), record.message.removeprefix("submit failed: "))
        with rt.store.begin() as conn:
            assert conn.execute(select(local_jobs)).all() == []
        assert_nothing_claimed(rt.store)
    finally:
        rt.store.dispose()
