"""``make demo`` and ``make airflow``: the example DAGs of ``dags/`` on the embedded default.

The embedded default is three local sites (``gridcore.config.default_grid``), SQLite for
Airflow's metadata and for gridcore's state, and no service: the VJ center runs inside
the process that needs it. Your own grid instead: ``$GRIDCORE_GRID`` (a grid file), with
``$GRIDCORE_CENTER_URL`` / ``$GRIDCORE_SITE_CENTER_URLS`` where its clusters reach a VJ
center (:data:`OWN_GRID`), are kept when set, and the demo says which grid it runs on.
Everything else lives under one directory, ``--home`` (``make``: ``.gridcore-demo/`` in
the checkout)::

    <home>/airflow/           AIRFLOW_HOME: airflow.cfg, airflow.db, logs, passwords file
    <home>/airflow.env        the environment of both, to source for the airflow CLI
    <home>/gridcore/          GRIDCORE_HOME: the local sites' storage, outputs
    <home>/gridcore-state.db  gridcore's state database (GRIDCORE_DB_URL)
    <home>/forcing/           the ensemble's watched forcing directory (GRIDCORE_FORCING_DIR)
    <home>/logs/<dag>.log     what each demo run printed (Airflow's task logs included)

``python -m gridcore_airflow.demo --home H`` runs every DAG of ``dags/``
through Airflow's real ``dag.test()`` (tasks in this process, each deferred trigger
inline) and prints, per DAG, each task instance (a mapped one by its label) with its
state and the site(s) it ran at, the DAG's result read from its XComs and gridcore's
state database, and whether the capacity ledger is consistent with nothing left held.
The exit status is 1 if any DAG failed (the lines of its output that say why are
printed), 2 if a DAG file does not import, there is no such DAG or ``$GRIDCORE_GRID``
is not a grid file. ``--standalone`` instead prepares ``airflow standalone`` on the same
home (the example DAGs, this plugin, a fixed login), prints the URL and the login and
replaces this process with it, so the demo's runs show in the UI. Both write
``<home>/airflow.env`` first; ``--prepare-only`` writes it and runs nothing.

The integration tests prepare the same way (``tests/integration/conftest.py``):
:class:`GridcoreEnv`, :func:`migrate_metadata_db`, :func:`dag_bag` and :data:`RUN_CONF`
are theirs too, so the demo runs what the tests check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from gridcore.config import GRID_ENV, load_grid
from gridcore.demo import GridcoreEnv
from gridcore.errors import ConfigError
from gridcore.model import HolderKind
from gridcore.state import capacity
from gridcore.state.store import open_store

AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))
CHECKOUT_DAGS = Path(__file__).resolve().parents[1] / "dags"
"""The checkout's example DAGs (this module is installed editable from the checkout)."""

# The order the demo runs them in: from one job per member to a whole batch pipeline.
DEMO_ORDER = ("ensemble_surge", "coallocated_poisson", "coreserved_poisson", "batch_pipeline")
RUN_CONF: Mapping[str, Mapping[str, Any]] = {
    # 6 members x 2 processors = 12 > the 8 processors of the best site (local-a), so
    # the burst spreads; members of 1 s keep dag.test()'s one-after-another run short.
    "ensemble_surge": {"storm": "demo", "members": 6, "processors": 2, "runtime_s": 1},
}
"""``run_conf`` per DAG for a manual run (the demo's and the integration tests'); a DAG
not named runs with its own params."""

STANDALONE_URL = "http://127.0.0.1:8080"
STANDALONE_LOGIN = ("admin", "admin")
OWN_GRID = (GRID_ENV, "GRIDCORE_CENTER_URL", "GRIDCORE_SITE_CENTER_URLS")
"""The user's variables the demo keeps: their grid file and where its clusters reach the
VJ center (``gridcore_airflow.operators.hooks``)."""
DEFAULT_CONN_ENV = "AIRFLOW_CONN_GRIDCORE_DEFAULT"


def demo_environment(home: Path, dags: Path, given: Mapping[str, str]) -> dict[str, str]:
    """The environment ``make demo`` and ``make airflow`` run in, over ``given`` (this
    process's): Airflow's configuration and gridcore's state under ``home``, and the
    user's own grid and VJ center (:data:`OWN_GRID`) when ``given`` sets them, the grid
    file made absolute (the environment is written to ``<home>/airflow.env`` and
    sourced anywhere)."""
    variables = airflow_variables(home / "airflow", dags) | GridcoreEnv.under(home).variables()
    for name in OWN_GRID:
        value = given.get(name, "").strip()
        if value:
            variables[name] = str(Path(value).resolve()) if name == GRID_ENV else value
    return variables


def grid_in_use(variables: Mapping[str, str], given: Mapping[str, str]) -> str:
    """Which grid the DAGs' tasks use, in one line (ConfigError for a grid file that is
    not one): the connection ``gridcore_default`` if ``given`` defines it (the hook asks
    it first), else ``$GRIDCORE_GRID``'s file, else the embedded default."""
    if given.get(DEFAULT_CONN_ENV):
        return f"as the connection gridcore_default says (${DEFAULT_CONN_ENV})"
    path = variables.get(GRID_ENV)
    if path is None:
        return "the embedded default: 3 local sites (set $GRIDCORE_GRID for your own)"
    sites = load_grid(path).site_names
    shown = ", ".join(sites[:8]) + (f" and {len(sites) - 8} more" if len(sites) > 8 else "")
    return f"{path} (${GRID_ENV}): {len(sites)} site{'s' * (len(sites) != 1)}, {shown}"


def write_airflow_env(home: Path, variables: Mapping[str, str]) -> Path:
    """``variables`` as ``<home>/airflow.env``, for ``set -a; . <home>/airflow.env;
    set +a`` before the ``airflow`` CLI on the demo's home."""
    path = home / "airflow.env"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key}={shlex.quote(value)}\n" for key, value in variables.items()))
    return path


def airflow_variables(airflow_home: Path, dags: Path) -> dict[str, str]:
    """Airflow's configuration for the demo, as environment variables (which take
    precedence over ``airflow.cfg``): SQLite under ``airflow_home``, the example DAGs,
    no Airflow examples, new DAGs unpaused."""
    return {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    }


def migrate_metadata_db(env: Mapping[str, str] | None = None) -> None:
    """``airflow db migrate`` as an operator would run it (idempotent, ~3 s on SQLite)."""
    done = subprocess.run(
        [AIRFLOW_BIN, "db", "migrate"],
        env=dict(os.environ if env is None else env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{done.stderr[-3000:]}")


def dag_bag(dags: Path) -> Any:
    """The DAGs of ``dags`` (parsed now: they read gridcore's environment at parse time)."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(dags))


# -- reading a run's outcome from the metadata DB -------------------------------------


def task_states(dag_id: str, run_id: str) -> dict[tuple[str, int], str | None]:
    return {(t.task_id, t.map_index): t.state for t in task_instances(dag_id, run_id)}


def xcom_values(dag_id: str, run_id: str, task_id: str) -> dict[int, Any]:
    """map_index -> the task's return value."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(run_id=run_id, key="return_value", task_ids=task_id, dag_ids=dag_id)
        ).all()
        return {row.map_index: XComModel.deserialize_value(row) for row in rows}


def rendered_map_indexes(dag_id: str, run_id: str, task_id: str) -> dict[int, str | None]:
    return {t.map_index: t.label for t in task_instances(dag_id, run_id) if t.task_id == task_id}


@dataclass(frozen=True)
class TaskInstanceRow:
    task_id: str
    map_index: int
    label: str | None  # the rendered map_index_template
    state: str | None
    started: datetime | None


def task_instances(dag_id: str, run_id: str) -> list[TaskInstanceRow]:
    """The run's task instances, tasks in the order they first started (never started:
    last), a mapped task's instances by map index."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id
        )
        rows = [
            TaskInstanceRow(
                ti.task_id,
                ti.map_index,
                ti.rendered_map_index,
                None if ti.state is None else str(getattr(ti.state, "value", ti.state)),
                ti.start_date,
            )
            for ti in tis
        ]
    first: dict[str, datetime] = {}
    for row in rows:
        if row.started is not None and (
            row.task_id not in first or row.started < first[row.task_id]
        ):
            first[row.task_id] = row.started
    return sorted(
        rows,
        key=lambda r: (r.task_id not in first, first.get(r.task_id) or 0, r.task_id, r.map_index),
    )


# -- the demo ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DagReport:
    dag_id: str
    run_id: str
    state: str
    seconds: float
    tasks: tuple[tuple[TaskInstanceRow, tuple[str, ...]], ...]  # each with its sites
    result: tuple[str, ...]
    problems: tuple[str, ...]  # the capacity ledger's, after the run

    @property
    def ok(self) -> bool:
        return _succeeded(self.state) and not self.problems


def _succeeded(state: str) -> bool:
    """A DAG run's state is success (imported here: Airflow reads its environment when
    first imported, which :func:`main` sets up first)."""
    from airflow.utils.state import DagRunState

    return DagRunState(state) is DagRunState.SUCCESS


def run_example(dag: Any, conf: Mapping[str, Any] | None, env: GridcoreEnv) -> DagReport:
    """One ``dag.test()`` of ``dag`` and what it did."""
    start = time.monotonic()
    run = dag.test(run_conf=dict(conf) if conf is not None else None)
    seconds = time.monotonic() - start
    xcoms = {task_id: xcom_values(dag.dag_id, run.run_id, task_id) for task_id in dag.task_ids}
    tasks = tuple(
        (row, sites_of(xcoms[row.task_id].get(row.map_index)) if on_sites(dag, row.task_id) else ())
        for row in task_instances(dag.dag_id, run.run_id)
    )
    state = str(getattr(run.state, "value", run.state))
    summarize = RESULTS.get(dag.dag_id, _no_result)
    try:
        result = tuple(summarize(Outcome(dag, run.run_id, xcoms, env))) if _succeeded(state) else ()
    except (KeyError, TypeError, ValueError) as exc:  # a result not of the expected shape
        result = (f"(result not readable: {exc!r})",)
    return DagReport(dag.dag_id, run.run_id, state, seconds, tasks, result, ledger_problems(env))


def on_sites(dag: Any, task_id: str) -> bool:
    """Whether the task is a gridcore operator's, which runs its work at sites (the
    others run in the Airflow worker, here this process)."""
    task = dag.get_task(task_id)
    operator = getattr(task, "operator_class", None) or type(task)  # a mapped one's class
    return str(operator.__module__).startswith("gridcore_airflow.")


def sites_of(value: Any) -> tuple[str, ...]:
    """The site(s) a task's XCom says it ran at: ``site``, or ``sites`` (one per
    component or pilot, repeats kept)."""
    if not isinstance(value, Mapping):
        return ()
    if isinstance(value.get("site"), str):
        return (value["site"],)
    sites = value.get("sites")
    if isinstance(sites, list) and all(isinstance(s, str) for s in sites):
        return tuple(sites)
    return ()


def ledger_problems(env: GridcoreEnv) -> tuple[str, ...]:
    """The capacity ledger after a run: every counter equal to its holds, and no hold
    but a staged replica's left live (every job of the run has finished)."""
    store = open_store(env.db_url)
    try:
        with store.begin() as conn:
            problems = [str(v) for v in capacity.check_invariant(conn)]
            problems += [
                f"left held: {hold}"
                for hold in capacity.live_holds(conn)
                if hold.kind != HolderKind.VOLUME
            ]
    finally:
        store.dispose()
    return tuple(problems)


@dataclass(frozen=True)
class Outcome:
    """What a DAG's result is read from: its return values by task and map index."""

    dag: Any
    run_id: str
    xcoms: Mapping[str, Mapping[int, Any]]
    env: GridcoreEnv


def _ensemble_result(outcome: Outcome) -> Iterator[str]:
    from gridcore.engine.runtime import GridRuntime

    xcoms, env = outcome.xcoms, outcome.env
    (summary,) = xcoms["summary"].values()
    members = xcoms["member"]
    per_site = ", ".join(f"{site} {n}" for site, n in sorted(summary["per_site"].items()))
    yield f"{len(members)} members on {len(summary['per_site'])} sites ({per_site})"
    queued = [r["queued_s"] for r in members.values() if r.get("queued_s") is not None]
    if queued:
        yield f"queued {min(queued):.2f} to {max(queued):.2f} s before starting"
    runtime = GridRuntime.open(db_url=env.db_url, upgrade=False)
    try:
        records = [runtime.record(r["selection_id"]) for r in members.values()]
    finally:
        runtime.store.dispose()
    agree = all(
        (rec.site, rec.state) == (r["site"], r["state"])
        for rec, r in zip(records, members.values(), strict=True)
    )
    states = sorted({str(rec.state) for rec in records})
    yield f"state DB: {len(records)} selections, {'/'.join(states)}" + (
        ", as the XComs say" if agree else ", DISAGREEING with the XComs"
    )


def _coallocated_result(outcome: Outcome) -> Iterator[str]:
    (placed,) = outcome.xcoms["coallocate"].values()
    (check,) = outcome.xcoms["check"].values()
    components = ", ".join(
        f"{size} on {site}" for size, site in zip(placed["sizes"], placed["sites"], strict=True)
    )
    yield f"components (processors on site): {components}; {placed['retries']} retries"
    yield (
        f"barrier skew {check['barrier_skew_s']:.3f} s; max |split - single-process|"
        f" {check['max_abs_diff']:.1e}"
    )


def _coreserved_result(outcome: Outcome) -> Iterator[str]:
    (reserved,) = outcome.xcoms["coreserve"].values()
    (check,) = outcome.xcoms["check"].values()
    clusters = ", ".join(f"{site} {n}" for site, n in sorted(reserved["clusters"].items()))
    yield (
        f"pilots per cluster: {clusters}; lifetime {reserved['lifetime_s']:.0f} s;"
        f" co-allocated in {check['coallocation_s']:.2f} s, dispatch skew"
        f" {check['dispatch_skew_s']:.3f} s"
    )
    yield f"max |split - single-process| {check['max_abs_diff']:.1e}"


def _pipeline_result(outcome: Outcome) -> Iterator[str]:
    from gridcore.engine.dataplan import run_id_from

    prepare = outcome.dag.get_task("prepare")
    jobs = [
        v
        for t in outcome.dag.tasks
        if t.task_type == "DataPlanPipelineOperator"
        for v in outcome.xcoms.get(t.task_id, {}).values()
    ]
    yield f"plan: {prepare.strategy} at {prepare.site}; {len(jobs)} pipeline tasks"
    out = Path(prepare.home_dir) / run_id_from(f"{outcome.dag.dag_id}-{outcome.run_id}")
    reports = sorted(out.glob("*/merge"))
    yield f"{len(reports)} sample reports (taxon counts) in {out}"


def _no_result(outcome: Outcome) -> Iterator[str]:
    yield f"{sum(len(v) for v in outcome.xcoms.values())} task results in XCom"


RESULTS: Mapping[str, Callable[[Outcome], Iterator[str]]] = {
    "ensemble_surge": _ensemble_result,
    "coallocated_poisson": _coallocated_result,
    "coreserved_poisson": _coreserved_result,
    "batch_pipeline": _pipeline_result,
}


def format_report(report: DagReport) -> str:
    rows = [("task", "state", "site")]
    for ti, sites in report.tasks:
        name = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
        if ti.label:
            name += f" {ti.label}"
        rows.append((name, ti.state or "-", ", ".join(sites)))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [
        f"== {report.dag_id}: {report.state} in {report.seconds:.1f} s (run {report.run_id})",
        *(
            f"  {name:<{widths[0]}}  {state:<{widths[1]}}  {sites}".rstrip()
            for name, state, sites in rows
        ),
        *(f"  result: {line}" for line in report.result),
        "  ledger: "
        + (
            "consistent, nothing held"
            if not report.problems
            else "; ".join(report.problems[:5]) + (" ..." if len(report.problems) > 5 else "")
        ),
    ]
    return "\n".join(lines)


def run_demo(dags: Path, env: GridcoreEnv, grid: str, only: Sequence[str] = ()) -> int:
    """Every DAG of ``dags`` (or ``only`` these), one after another, on ``grid`` (what
    :func:`grid_in_use` says); the exit status."""
    started = time.monotonic()
    print(f"gridcore demo: the example DAGs of {dags} through Airflow's dag.test()")
    print(f"  grid: {grid}")
    print(
        f"  SQLite (Airflow: {os.environ['AIRFLOW_HOME']},"
        f" gridcore: {env.db_url.removeprefix('sqlite:///')});"
        f" the airflow CLI on it: set -a; . {env.base / 'airflow.env'}; set +a",
        flush=True,
    )
    migrate_metadata_db()
    logs = env.base / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with _output_to(logs / "prepare.log"):
        open_store(env.db_url, upgrade=True).dispose()  # gridcore db upgrade
        bag = dag_bag(dags)
    if bag.import_errors:
        for path, error in bag.import_errors.items():
            print(f"!! {path} does not import:\n{error}", file=sys.stderr)
        return 2
    if not bag.dags:
        print(f"!! no DAG in {dags}")
        return 2
    names = list(only) or _in_demo_order(bag.dags)
    unknown = sorted(set(names) - set(bag.dags))
    if unknown:
        print(f"!! no such DAG: {', '.join(unknown)}; known: {', '.join(sorted(bag.dags))}")
        return 2
    failed = []
    for dag_id in names:
        log = logs / f"{dag_id}.log"
        print(f"\nrunning {dag_id} (its output: {log}) ...", flush=True)
        with _output_to(log):
            report = run_example(bag.dags[dag_id], RUN_CONF.get(dag_id), env)
        print(format_report(report), flush=True)
        if not report.ok:
            failed.append(dag_id)
            print("  from its output:\n    " + "\n    ".join(error_lines(log)))
    total = time.monotonic() - started
    verdict = f"FAILED: {', '.join(failed)}" if failed else "every DAG succeeded"
    print(f"\n{len(names)} DAG{'s' * (len(names) != 1)} in {total:.0f} s: {verdict}")
    return 1 if failed else 0


_ERROR_LINE = re.compile(r"^\s*[\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def error_lines(log: Path, context: int = 12) -> list[str]:
    """The lines of a run's output that say why it failed: up to the last exception
    line (with the ``context`` lines before it), else the last lines."""
    lines = log.read_text(errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if _ERROR_LINE.match(line)), default=None)
    if last is None:
        return lines[-2 * context :]
    return lines[max(0, last - context) : last + 1]


def _in_demo_order(dag_ids: Mapping[str, Any]) -> list[str]:
    known = [d for d in DEMO_ORDER if d in dag_ids]
    return known + sorted(set(dag_ids) - set(known))


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (the file descriptors: Airflow's task logs,
    the tasks' prints and the site jobs' launchers all write there) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


# -- airflow standalone ----------------------------------------------------------------


def prepare_standalone(home: Path, dags: Path, given: Mapping[str, str]) -> dict[str, str]:
    """Everything ``airflow standalone`` needs to show the example DAGs on ``home``:
    the fixed login written to the simple auth manager's passwords file, the plugin's
    entry point checked, and the environment (:func:`demo_environment` over ``given``,
    also written to ``<home>/airflow.env``, to use the ``airflow`` CLI on the same home:
    ``set -a; . <home>/airflow.env``)."""
    plugin = [e for e in metadata.entry_points(group="airflow.plugins") if e.name == "gridcore"]
    if not plugin:
        raise RuntimeError(
            "the gridcore Airflow plugin is not installed (entry point airflow.plugins:"
            " gridcore); install the package: pip install -e '.[airflow]'"
        )
    airflow_home = home / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    user, password = STANDALONE_LOGIN
    passwords = airflow_home / "simple_auth_manager_passwords.json.generated"
    passwords.write_text(json.dumps({user: password}) + "\n")
    variables = {
        **demo_environment(home, dags, given),
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{user}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": STANDALONE_URL.rsplit(":", 1)[1],
    }
    write_airflow_env(home, variables)
    return variables


def _standalone(home: Path, dags: Path, grid: str, start: bool = True) -> int:
    variables = prepare_standalone(home, dags, os.environ)
    user, password = STANDALONE_LOGIN
    print(f"Airflow standalone with the gridcore plugin and the DAGs of {dags}")
    print(f"  URL:   {STANDALONE_URL}")
    print(f"  login: {user} / {password}")
    print(f"  grid:  {grid}")
    print(f"  home:  {home}  (CLI on it: set -a; . {home / 'airflow.env'}; set +a)")
    print(
        f"  forcing: {variables['GRIDCORE_FORCING_DIR']}  (a *.json dropped here starts"
        " ensemble_surge)"
    )
    if not start:
        print(
            f"  prepared, not started: {AIRFLOW_BIN} standalone with that environment", flush=True
        )
        return 0
    print("  Ctrl-C stops it.", flush=True)
    env = dict(os.environ) | variables
    # standalone starts its components as `airflow ...` from PATH: this installation's
    env["PATH"] = os.pathsep.join([str(Path(AIRFLOW_BIN).parent), env.get("PATH", "")])
    os.execve(AIRFLOW_BIN, [AIRFLOW_BIN, "standalone"], env)
    return 0  # not reached: execve replaced this process


# -- command line -------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gridcore_airflow.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--home", default=".gridcore-demo", help="where everything is kept")
    parser.add_argument("--dags", default=str(CHECKOUT_DAGS), help="the DAGs folder")
    parser.add_argument("--only", action="append", default=[], metavar="DAG_ID", help="run these")
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="start `airflow standalone` on the same home instead (prints URL and login)",
    )
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="write <home>/airflow.env (with --standalone also the login), run nothing",
    )
    args = parser.parse_args(argv)
    home, dags = Path(args.home).resolve(), Path(args.dags).resolve()
    if not dags.is_dir():
        parser.error(f"--dags: {dags} is not a directory (run from the gridcore checkout)")
    wanted = demo_environment(home, dags, os.environ)
    try:
        grid = grid_in_use(wanted, os.environ)
    except ConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: ${GRID_ENV}: {exc}\n")
    if args.standalone:
        return _standalone(home, dags, grid, start=not args.prepare_only)
    env_file = write_airflow_env(home, wanted)
    if args.prepare_only:
        print(f"grid: {grid}\nthe demo's environment: set -a; . {env_file}; set +a")
        return 0
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        # Airflow read its home and its DAGs folder when this package imported it: run
        # again in a process whose environment is the demo's from the start.
        given = sys.argv[1:] if argv is None else argv
        command = [sys.executable, "-m", "gridcore_airflow.demo", *given]
        child = dict(os.environ) | wanted
        return subprocess.run(command, env=child, check=False).returncode
    return run_demo(dags, GridcoreEnv.under(home), grid, args.only)
