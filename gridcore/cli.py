"""The ``gridcore`` command line. ``--json`` prints ONE JSON object on stdout; logs and
tables go to stderr in that case so the output can be piped."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.contrib.logging import logging_redirect_tqdm

from gridcore.errors import ConfigError, GridError, RequestError
from gridcore.experiments import registry
from gridcore.progress import progress_mode

if TYPE_CHECKING:
    from gridcore.dataplan.format import PipelineSpec
    from gridcore.dataplan.planning import CanonicalWorkload, SitePlan
    from gridcore.engine.runtime import GridRuntime, JobRecord
    from gridcore.model import GridSpec

log = logging.getLogger("gridcore")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except GridError as exc:
        # Bad input (a malformed grid file or request) and every other refusal: one line
        # naming the file and field, exit status 2, no traceback.
        print("gridcore: error: " + " | ".join(str(exc).splitlines()), file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gridcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, grid: bool = True) -> None:
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        p.add_argument(
            "--db", help="state DB URL (default $GRIDCORE_DB_URL or SQLite in $GRIDCORE_HOME)"
        )
        if grid:
            p.add_argument(
                "--grid",
                help="grid description file (default $GRIDCORE_GRID or the embedded local sites)",
            )

    p = sub.add_parser(
        "sites",
        help="idle/total processors, claimed processors and bytes by kind of holder, storage,"
        " health per site",
    )
    common(p)
    p.add_argument("--no-refresh", action="store_true", help="show stored observations only")
    p.add_argument(
        "--restore",
        metavar="SITE",
        action="append",
        default=[],
        help="make a site usable again (after repeated errors); may be repeated",
    )
    p.set_defaults(handler=_sites)

    _submit_parser(sub, common)

    _replay_parser(sub, common)
    _replay_cancel_parser(sub, common)

    p = sub.add_parser("demo", help="an ensemble burst on the embedded local sites")
    common(p)
    p.add_argument("--members", type=int, default=10)
    p.add_argument("--steps", type=int, default=3000, help="work per member (time steps)")
    p.set_defaults(handler=_demo)

    p = sub.add_parser("experiment", help="reproduce a paper's experiment in the simulator")
    p.add_argument("name", choices=sorted(registry.EXPERIMENTS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--runs", type=int, help="repetitions (the experiment's default if omitted)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="run seeds SEED..SEED+N-1 and add over_seeds: per figure the mean and 95 %% Student t"
        " interval, and how many seeds keep the paper's ordering (the other keys and the plot"
        " are SEED's; default 1: one seed; koala-idle-soon compares its two arms over them,"
        " default 10)",
    )
    p.add_argument(
        "--cases",
        type=int,
        metavar="N",
        help="selection-robustness, dataplan-robustness: how many random cases (seeds --seed"
        " onwards; default 300 and 800)",
    )
    p.add_argument(
        "--case",
        type=int,
        metavar="SEED",
        help="stateful-selection: replay selection-robustness's case SEED instead of the"
        " canonical trace (its sites, members, external load and monitor interval)",
    )
    p.add_argument(
        "--all-orderings",
        action="store_const",
        const=True,
        help="stateful-selection: also run the 24 orderings of the four sites' speeds over"
        " the seeds and report the default policy's completion / naive (key orderings)",
    )
    p.add_argument(
        "--live",
        action="store_const",
        const=True,
        help="dataplan: run every feasible plan on real local sites (VJM's Fig. 3 on the"
        " Slurm test grid: python -m tests.slurm.live_vjm, from a checkout)",
    )
    p.add_argument(
        "--comm-factor",
        type=float,
        metavar="X",
        help="koala-placement: scale of the co-allocation penalty in the execution-time growth"
        " table, t1 + X * (t_c - t1) (default 1; 0 removes the penalty)",
    )
    p.add_argument(
        "--growth-table",
        metavar="JSON",
        help="koala-placement: execution time (s) by job size and clusters combined, e.g."
        ' \'{"36": [100, 140, 170, 195], "64": [...], "72": [...]}\' (default: the'
        " reconstruction of Fig. 5 reported under setup.execution_time_s)",
    )
    p.add_argument(
        "--monitor-interval",
        type=float,
        metavar="S",
        help="stateful-selection: seconds between monitor (MDS) reports (default 60, MDS's)",
    )
    p.add_argument(
        "--trace",
        metavar="LOG.swf",
        help="wait-prediction: the workload log to replay (Standard Workload Format, .swf or"
        " .swf.gz)",
    )
    p.add_argument(
        "--cluster",
        type=int,
        metavar="N",
        help="wait-prediction: only the jobs of partition N (field 16) of a multi-cluster log",
    )
    p.add_argument(
        "--poll",
        type=float,
        metavar="S",
        help="wait-prediction: also replay the default model as the live engine runs it,"
        " seeing the queue at most every S seconds (predictor predicted_backfill_polled)",
    )
    _log_load_arguments(p)
    p.add_argument("--plot", help="PNG path (default out/<name>.png; '' to skip)")
    p.set_defaults(handler=_experiment)

    p = sub.add_parser("bench", help="measure decision throughput")
    p.add_argument("name", choices=sorted(registry.BENCHMARKS))
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--pg-url", help="PostgreSQL URL (default $GRIDCORE_BENCH_PG_URL or the local test DB)"
    )
    p.add_argument("--decisions", type=int, default=2000)
    p.add_argument("--per-process", type=int, default=250)
    p.add_argument("--grid", help="slurm-polling: the grid file (default $GRIDCORE_GRID)")
    p.add_argument("--site", help="slurm-polling: the Slurm site (default the grid's first)")
    p.set_defaults(handler=_bench)

    p = sub.add_parser(
        "plan",
        help="data-driven plan for a batch-pipeline file (DADC 2009): feasible strategies,"
        " every chooser's predictions and pick, the padding to canonical",
        description="Plan a batch-pipeline file (format: gridcore/dataplan/format.py) on the"
        " grid's sites. With --json one object: feasible, predicted {CHOOSER: {STRATEGY:"
        " seconds, null when infinite}}, picks {CHOOSER: STRATEGY}, reasons {CHOOSER:"
        " [...]}, padding, site, workload, environment. With --site, that site's plan and"
        " exactly those keys. Without --site every site of the grid is planned: the keys"
        " above are then the site whose pick by the default chooser (simulation) is"
        " predicted fastest, plus sites"
        " {NAME: that site's object without padding} and site_choice {by, reason,"
        " skipped {NAME: why}} (a site without storage_gb is skipped; none left: exit 2).",
    )
    common(p)
    p.add_argument("pipeline", metavar="PIPELINE.toml", help="the pipeline file")
    p.add_argument(
        "--site",
        help="plan for this site only (default: every site of the grid, choosing the fastest)",
    )
    p.add_argument(
        "--refine",
        action="store_true",
        help="refine the file's runtimes and each site's BW_R with what earlier runs measured"
        " (the state database's completed pipeline jobs and staging rates; key refinement)",
    )
    p.set_defaults(handler=_plan)

    p = sub.add_parser(
        "serve",
        help="the VJ center's HTTP API for pilots and barrier components (token auth), and"
        " the Grid page at /grid/ (operator token: $GRIDCORE_DASHBOARD_TOKEN; docs/grid-page.md)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8790, help="port to listen on")
    p.add_argument(
        "--db", help="state DB URL (default $GRIDCORE_DB_URL or SQLite in $GRIDCORE_HOME)"
    )
    p.set_defaults(handler=_serve)

    _trace_parser(sub)

    p = sub.add_parser("db", help="state database maintenance")
    p.add_argument("action", choices=["upgrade"])
    common(p, grid=False)
    p.set_defaults(handler=_db)
    return parser


_SUBMIT_DESCRIPTION = """\
Run COMMAND (its words, quoted for the site's shell: write sh -c '...' for shell syntax)
on one site, as sbatch -M a,b,c does: the default selection policy (earliest estimated
completion) chooses among every site of the grid, among the --site sites given, or takes
the one --site given; the job is submitted under its selection's key (exactly once) and
what was done is printed. Unset resources come from the site's [sites.NAME.defaults],
else the cluster's own defaults apply (a local site enforces --time-limit, refuses
--gpus and ignores the rest).

--wait follows the job (polls every 0.25 s, doubling to 2 s), prints its new stdout and
stderr lines as [stdout] ... / [stderr] ... as they appear, and exits with its exit code
(a job failed or cancelled without one: 1); Ctrl-C while waiting cancels the job (exit
130). --json prints ONE JSON object on stdout: site, job_id, selection_id, state,
exit_code, message, release and api_version (Slurm sites; null for local ones), stdout
and stderr (the output files), resources (what was sent, over the site's defaults),
reasons (the selection's) and usage (the site's accounting of a finished job, else
null); every other line then goes to stderr.

--test-only submits nothing and records no selection, as sbatch --test-only: it prints
the site the job would go to now (the policy's choice, or the --site given) and why,
and per site the estimated queue delay (the wait model's forecast, with its bound once
the site's residuals give one, else Eq. W) and completion; with --json ONE object:
site, outcome (fit, or queue: it would wait there), reasons, sites {NAME: fits,
queue_delay_s, completion_s, wait_model (null or predictor, wait_s, bound_s,
confidence, reason)}. It observes the sites as any decision does (their health left as
it was) and stores what the wait models forecast of their queues. Exit status 0 (2
for bad input, as below).

Exit status: 0 once submitted (without --wait); the job's (with --wait); 2 for bad input
(no command, processors < 1, an unknown site, a malformed time limit or memory, a
request the site refuses), refused in one line naming the field before anything is
submitted; 1 for any other error (a site unreachable, a credential rejected)."""


def _submit_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "submit",
        help="run one job on a site chosen by the default policy (sbatch -M a,b,c's twin)",
        description=_SUBMIT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="gridcore submit [options] --processors N -- COMMAND [ARG ...]",
    )
    common(p)
    p.add_argument(
        "--site",
        action="append",
        default=[],
        metavar="NAME",
        help="once: run there; several times: choose only among these (default: every site)",
    )
    p.add_argument("--processors", required=True, metavar="N", help="processors (>= 1)")
    resources = (
        ("--time-limit", "T", "90s, 10m, 2h, 1d, Slurm's MM, MM:SS, HH:MM:SS, D-HH:MM:SS"),
        ("--account", "A", "the account charged"),
        ("--qos", "Q", "the quality of service"),
        ("--partition", "P", "the partition (over the site's own)"),
        ("--memory", "SIZE", "per node: 512M, 4G, 1T or MiB"),
        ("--memory-per-cpu", "SIZE", "per processor, same units; not with --memory"),
        ("--gpus", "N", "GPUs for the job (a local site has none)"),
        ("--constraint", "C", "a Slurm feature expression (intel&ib)"),
    )
    for option, metavar, text in resources:
        p.add_argument(option, metavar=metavar, help=text)
    p.add_argument("--name", help="the job's name (default: the command's first word)")
    p.add_argument("--workdir", metavar="DIR", help="where the job runs (relative: to here)")
    p.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="set in the job; repeatable"
    )
    p.add_argument("--wait", action="store_true", help="follow the job; exit with its code")
    p.add_argument(
        "--test-only",
        action="store_true",
        help="submit nothing and record no selection: say where the job would run now, and"
        " each site's estimated queue delay (the wait model's forecast and bound) and completion",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    p.set_defaults(handler=_submit)


_REPLAY_DESCRIPTION = """\
Submit a workload log's jobs (SWF, .swf or .swf.gz) to live sites as another user's
sleep jobs: each at its submit time less the window's START (by default the first
job's) divided by --speedup, with its processors (a job larger than its site is capped
to the site's largest job, or skipped: --oversize), sleeping its run time / speedup,
with its requested time / speedup as its time limit (whole seconds; Slurm enforces
whole minutes, rounded up). The jobs carry no gridcore key: every engine counts them as
other users' load.

It stops by itself: after --max-jobs jobs, at the window's END, or for jobs due after
--max-duration seconds; once everything is submitted it waits for its jobs until
--max-duration has passed since it started (--at-end wait) or not (--at-end cancel),
then cancels what is still pending or running. Ctrl-C or SIGTERM cancels what it
submitted and exits (130, 143). It prints its run id on stderr at its start: killed
outright (SIGKILL), it cancels nothing, and `gridcore replay-cancel RUN` does.
docs/workloads.md, section "gridcore replay".

--json prints one object: run, submitted, skipped {reason: count}, capped, completed,
failed, cancelled, lost, lost_found, left_running, sites {NAME: counts}, lag_s and
lag_log_s {median, p95, max} (achieved - intended submit time, wall and log seconds),
speedup, jobs [...].

Exit status: 0 when done with nothing left running; 2 for bad input (an option, the
grid, the log's file, line and field), refused before anything is submitted; 1 when a
job could not be confirmed ended (left_running) or a site failed before the start."""


def _replay_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    from gridcore.engine.replay import AtEnd
    from gridcore.workloads.replay import (
        DEFAULT_MAX_DURATION_S,
        DEFAULT_MAX_JOBS,
        Oversize,
    )

    p = sub.add_parser(
        "replay",
        help="submit a workload log's jobs (SWF) to live sites as other users' load",
        description=_REPLAY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(p)
    p.add_argument("log", metavar="LOG.swf[.gz]", help="the workload log")
    p.add_argument(
        "--site-map",
        action="append",
        default=[],
        required=True,
        metavar="PART=SITE[+SITE]",
        help="partition (field 16) or * -> site(s), taken in turn; repeatable or comma-separated",
    )
    p.add_argument("--speedup", type=float, required=True, metavar="N", help="log time / N")
    p.add_argument(
        "--window",
        default=":",
        metavar="START:END",
        help="log seconds (or with s, m, h, d) of the jobs to replay, each optional (default"
        " ':': from the log's first job to its end)",
    )
    p.add_argument("--max-jobs", type=int, default=DEFAULT_MAX_JOBS, metavar="K")
    p.add_argument(
        "--max-duration",
        type=float,
        default=DEFAULT_MAX_DURATION_S,
        metavar="S",
        help=f"wall seconds the replay lasts at most (default {DEFAULT_MAX_DURATION_S:g})",
    )
    p.add_argument(
        "--oversize", choices=[o.value for o in Oversize], default=Oversize.CAP.value,
        help="a job larger than its site: capped to the site's largest job, or skipped",
    )  # fmt: skip
    p.add_argument(
        "--at-end", choices=[a.value for a in AtEnd], default=AtEnd.WAIT.value,
        help="once all is submitted: wait until --max-duration, or cancel at once",
    )  # fmt: skip
    p.set_defaults(handler=_replay)


_REPLAY_CANCEL_DESCRIPTION = """\
Cancel what a replay killed outright (SIGKILL, a lost machine) left behind: every job of
its run (named gcreplay-RUN-..., with no gridcore key) still pending or running at the
sites --site-map names (the replay's own --site-map; default: every site of the grid),
asked again after each look while one is still shown (at most 5 times each) and followed
until the sites show them ended (at most 60 s). No other job is touched. RUN is what the
replay printed at its start ("replay RUN: ...") and in its summary's run.

--json prints one object: run, prefix, sites, found, cancelled, ended_by_themselves,
left_running [{site, job_id, name, state, cancel_error}], unread_sites {SITE: error},
wall_s, jobs [...].

Exit status: 0 when no job of the run is left pending or running; 2 for bad input (RUN,
--site-map, the grid); 1 when a job is still shown pending or running or a site could
not be listed. docs/workloads.md, section "gridcore replay"."""


def _replay_cancel_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "replay-cancel",
        help="cancel the jobs a killed `gridcore replay` left pending or running",
        description=_REPLAY_CANCEL_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(p)
    p.add_argument("run", metavar="RUN", help="the replay's run id (it prints it at its start)")
    p.add_argument(
        "--site-map",
        action="append",
        default=[],
        metavar="PART=SITE[+SITE]",
        help="the replay's --site-map: the sites to look at (default: every site of the grid)",
    )
    p.set_defaults(handler=_replay_cancel)


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(data, sort_keys=True))
        if text:
            print(text, file=sys.stderr)
    else:
        print(text)


def _runtime(args: argparse.Namespace) -> Any:
    from gridcore.engine.runtime import GridRuntime

    return GridRuntime.open(getattr(args, "grid", None), args.db)


def _sites(args: argparse.Namespace) -> int:
    from gridcore.engine.health import UNUSABLE_AFTER_ERRORS, restore_site, set_aside_because

    rt = _runtime(args)
    for name in args.restore:
        rt.grid.site(name)  # an unknown name is an error, not a silent no-op
        restore_site(rt.store, name)
    # a look, not a use: a site that cannot be reached now is shown so, not counted
    # against its health (the engines' own refreshes count)
    errors = {} if args.no_refresh else rt.refresh(count_health=False)
    rows = rt.site_rows()
    header = (
        f"{'site':<12} {'kind':<6} {'idle/total':>10} {'free':>5} {'claimed':>7} {'queued':>6}"
        f" {'others q':>8} {'storage used/limit':>20} {'usable':>6}"
    )
    lines = [header]
    for r in rows:
        limit = "unlimited" if r.storage_total is None else _bytes(r.storage_total)
        lines.append(
            f"{r.name:<12} {r.kind:<6} {f'{r.idle}/{r.total}':>10} {r.free:>5} {r.claimed:>7}"
            f" {r.queued:>6} {r.external_pending:>8}"
            f" {f'{_bytes(r.storage_claimed)}/{limit}':>20} {'yes' if r.usable else 'NO':>6}"
        )
        if r.release or r.api_version:
            lines.append(f"  Slurm {r.release or '(release unknown)'}, REST {r.api_version}")
        if errors.get(r.name):
            lines.append(f"  not observed now (not counted as its error): {errors[r.name]}")
        for kind, held in r.holds.items():
            lines.append(
                f"  held by {held['holds']} {kind}(s): {held['processors']} processors,"
                f" {_bytes(held['bytes'])}"
            )
        if not r.usable:
            because = set_aside_because(r.consecutive_errors, r.last_error, r.last_error_at)
            probe = f"probe job {r.probe_job_id} running" if r.probe_job_id else "probe pending"
            lines.append(
                f"  set aside {because}; {probe}: usable again when a probe completes"
                f" (or: gridcore sites --restore {r.name})"
            )
        elif r.consecutive_errors or r.last_error:
            lines.append(
                f"  {r.consecutive_errors} consecutive errors (unusable at"
                f" {UNUSABLE_AFTER_ERRORS}); last: {r.last_error}"
            )
    data = {"sites": [vars(r) | {"refresh_error": errors.get(r.name)} for r in rows]}
    _emit(args, data, "\n".join(lines))
    return 0


def _bytes(n: int) -> str:
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _submit(args: argparse.Namespace) -> int:
    """Bad input raises (main: exit status 2) before the state database is opened; a
    request the site refuses does too. Any other gridcore error: one line, status 1."""
    from gridcore import submit as job
    from gridcore.engine.runtime import GridRuntime
    from gridcore.state.store import open_store
    from gridcore.validation import RESOURCE_KEYS

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    grid = _grid(args)
    plan = job.plan_submit(
        grid,
        command,
        args.processors,
        sites=args.site,
        name=args.name,
        workdir=args.workdir,
        env=args.env,
        resources={key: getattr(args, key) for key in RESOURCE_KEYS},
    )
    if args.test_only and args.wait:
        raise ConfigError("--test-only submits nothing: --wait has no job to follow")
    say = functools.partial(print, file=sys.stderr if args.json else sys.stdout, flush=True)
    runtime, submitted = None, None
    try:
        runtime = GridRuntime(grid, open_store(args.db, upgrade=True))
        if args.test_only:
            data = job.test_only(runtime, plan)
            say(*job.test_only_lines(data), sep="\n  ")
            if args.json:
                print(json.dumps(data, sort_keys=True))
            return 0
        record = submitted = job.submit_planned(runtime, plan)
        say(f"submitted {job.outcome(record)}", *record.reasons, sep="\n  ")
        status = 0
        if args.wait:
            record, status = _wait(runtime, record, say)
        data = job.describe(runtime, record, plan.submission.resources)
    except (ConfigError, RequestError):
        raise  # refused by the site before it was submitted: exit status 2, as bad input
    except GridError as exc:
        where = "" if submitted is None else f"selection {submitted.selection_id}: "
        print(f"gridcore: error: {where}" + " | ".join(str(exc).splitlines()), file=sys.stderr)
        return 1
    finally:
        if runtime is not None:
            runtime.store.dispose()
    if args.json:
        print(json.dumps(data, sort_keys=True))
    return status


def _wait(
    runtime: GridRuntime, record: JobRecord, say: Callable[..., None]
) -> tuple[JobRecord, int]:
    """Follow the job to its end: (its last record, the exit status to return)."""
    from gridcore import submit as job

    try:
        record = job.follow(runtime, record, say)
    except KeyboardInterrupt:
        record = runtime.cancel(record.selection_id)
        print(f"gridcore: interrupted: cancelled {job.outcome(record)}", file=sys.stderr)
        return record, job.INTERRUPTED
    say(job.outcome(record))
    return record, job.exit_status(record)


def _hidden_password(url: str) -> str:
    """``url`` as a person may see it printed: a password in it replaced by ``***``."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not a URL SQLAlchemy parses: as given
        return url


def _replay(args: argparse.Namespace) -> int:
    """Every option, the grid and the log's lines the plan reads are checked before the
    state database is opened (exit 2); then the sites' sizes are read, the plan made,
    each job checked by its site, and only then is anything submitted. A site that
    fails before the start: one line, exit status 1 (as ``gridcore submit``)."""
    from gridcore.engine.runtime import GridRuntime
    from gridcore.state.store import open_store
    from gridcore.workloads import replay as plans
    from gridcore.workloads.swf import iter_jobs

    plans.check_settings(args.speedup, args.max_jobs, args.max_duration)
    settings = plans.ReplaySettings(
        args.speedup,
        plans.parse_window(args.window),
        args.max_jobs,
        args.max_duration,
        plans.Oversize(args.oversize),
    )
    grid = _grid(args)
    site_map = plans.parse_site_map(args.site_map, grid.site_names)
    # The log's lines as far as the plan reads them, checked before anything is opened.
    upper = [plans.ReplaySite(s.name, s.processors) for s in grid.sites]
    _replay_nonempty(args, plans.plan_replay(iter_jobs(args.log), site_map, upper, settings))
    runtime = None
    try:
        runtime = GridRuntime(grid, open_store(args.db, upgrade=True))
        report = _replay_live(args, runtime, site_map, settings)
    except (ConfigError, RequestError):
        raise  # bad input, or a job no site could ever run: nothing was submitted
    except GridError as exc:
        print("gridcore: error: " + " | ".join(str(exc).splitlines()), file=sys.stderr)
        return 1
    finally:
        if runtime is not None:
            runtime.store.dispose()
    data = report.as_json()
    _emit(args, data, _replay_text(data))
    if report.interrupted:
        return 128 + int(getattr(signal, report.interrupted, signal.SIGINT))
    return 0 if report.ok else 1


def _replay_live(
    args: argparse.Namespace, runtime: GridRuntime, site_map: Any, settings: Any
) -> Any:
    """The plan on the sites' real sizes, checked by each site, then run with SIGINT and
    SIGTERM stopping it (what it submitted is cancelled)."""
    from gridcore.engine import replay as runner
    from gridcore.workloads import replay as plans
    from gridcore.workloads.swf import iter_jobs

    sites = [runner.replay_site(runtime.adapter(name)) for name in site_map.site_names]
    plan = plans.plan_replay(iter_jobs(args.log), site_map, sites, settings)
    _replay_nonempty(args, plan)
    replay = runner.ReplayRunner(plan, runtime.adapter, at_end=runner.AtEnd(args.at_end))
    replay.check()
    if not replay.jobs:
        raise plans.ReplayError(
            f"{args.log}: every planned job was refused by its site (the log above says why)"
        )
    # Killed outright it cancels nothing: its run id is what finds its jobs then.
    again = ["gridcore", "replay-cancel", replay.run_id, "--site-map", ",".join(args.site_map)]
    again += ["--grid", args.grid] if args.grid else []
    # the state database too: a local site's jobs are in it (its password hidden)
    again += ["--db", _hidden_password(args.db)] if args.db else []
    print(
        f"replay {replay.run_id}: submitting {len(replay.jobs)} jobs; if this process is"
        f" killed: {shlex.join(again)}",
        file=sys.stderr,
        flush=True,
    )
    with _on_signals(replay.interrupt):
        return replay.run()


def _replay_cancel(args: argparse.Namespace) -> int:
    """RUN, --site-map and the grid are checked before the state database is opened
    (exit 2); a site that cannot be listed is reported, and exits 1 as a job left."""
    from gridcore.engine import replay as runner
    from gridcore.engine.runtime import GridRuntime
    from gridcore.state.store import open_store
    from gridcore.workloads import replay as plans

    run = plans.check_run(args.run)
    grid = _grid(args)
    sites = (
        plans.parse_site_map(args.site_map, grid.site_names).site_names
        if args.site_map
        else list(grid.site_names)
    )
    runtime = GridRuntime(grid, open_store(args.db, upgrade=True))
    try:
        report = runner.cancel_run(run, sites, runtime.adapter)
    finally:
        runtime.store.dispose()
    data = report.as_json()
    _emit(args, data, _replay_cancel_text(data))
    return 0 if report.ok else 1


def _replay_cancel_text(data: dict[str, Any]) -> str:
    lines = [
        f"replay-cancel {data['run']}: {data['found']} pending or running at"
        f" {', '.join(data['sites'])}; {data['cancelled']} cancelled,"
        f" {data['ended_by_themselves']} ended by themselves,"
        f" {len(data['left_running'])} left running"
    ]
    lines += [
        f"  left running: site {j['site']} job {j['job_id']} ({j['name']}, {j['state']})"
        + (f": {j['cancel_error']}" if j["cancel_error"] else "")
        for j in data["left_running"]
    ]
    lines += [f"  site {site} not listed: {why}" for site, why in data["unread_sites"].items()]
    if not data["found"] and not data["unread_sites"]:
        lines.append(
            "  no job of this run is pending or running there: if the replay was killed"
            " with jobs live, check the run id, --site-map and --db it printed at its start"
        )
    return "\n".join(lines)


def _replay_nonempty(args: argparse.Namespace, plan: Any) -> None:
    """Exit 2 when the plan submits nothing: a replay of nothing is a mistaken window
    or site map, said with what was skipped."""
    from gridcore.workloads.replay import ReplayError

    if plan.jobs:
        return
    raise ReplayError(
        f"{args.log}: no job to replay in --window {args.window} with --site-map"
        f" {','.join(args.site_map)} at --speedup {args.speedup:g}: {plan.why_empty()}"
    )


@contextlib.contextmanager
def _on_signals(call: Callable[[str], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``call(name)`` inside the block (the replay then cancels
    what it submitted and stops); the previous handlers come back after it."""

    def handler(signum: int, frame: object) -> None:
        call(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _replay_text(data: dict[str, Any]) -> str:
    lag = data["lag_s"]
    lines = [
        f"replay {data['run']}: {data['submitted']} submitted of {data['planned']} planned"
        f" (speedup {data['speedup']:g}, stopped by {data['stopped_by']}),"
        f" {data['capped']} capped, skipped {data['skipped'] or 'none'}",
        f"  ended: {data['completed']} completed, {data['failed']} failed,"
        f" {data['cancelled']} cancelled ({data['cancelled_by_replay']} by the replay),"
        f" {data['lost']} lost ({data['lost_found']} lost answers found by name),"
        f" {len(data['left_running'])} left running"
        f" ({sum(1 for j in data['left_running'] if j['cancel_error'])} could not be cancelled)",
        f"  submit lag (achieved - intended): median {lag['median']} s, p95 {lag['p95']} s,"
        f" max {lag['max']} s; wall {data['wall_s']} s",
    ]
    for site, counts in data["sites"].items():
        lines.append(f"  {site}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if data["interrupted"]:
        lines.append(f"  interrupted by {data['interrupted']}: cancelled what it submitted")
    return "\n".join(lines)


def _demo(args: argparse.Namespace) -> int:
    from gridcore.demo import format_table, run_demo

    rt = _runtime(args)
    result = run_demo(
        rt, members=args.members, steps=args.steps, log=lambda m: print(m, file=sys.stderr)
    )
    data = {
        "ok": result.ok,
        "wall_s": round(result.wall_s, 3),
        "sites_used": sorted(result.sites_used()),
        "members": [r.as_json() for r in result.records],
    }
    _emit(args, data, format_table(result))
    return 0 if result.ok else 1


def _experiment(args: argparse.Namespace) -> int:
    return _run_registered(args, registry.load(registry.EXPERIMENTS, args.name))


def _bench(args: argparse.Namespace) -> int:
    return _run_registered(args, registry.load(registry.BENCHMARKS, args.name))


def _run_registered(args: argparse.Namespace, entry: registry.Experiment) -> int:
    """Run a registered experiment or benchmark: figures, plot, table, exit status."""
    options = registry.RunOptions(
        seed=getattr(args, "seed", 0),
        runs=getattr(args, "runs", None),
        pg_url=getattr(args, "pg_url", None),
        decisions=getattr(args, "decisions", 2000),
        per_process=getattr(args, "per_process", 250),
        seeds=entry.default_seeds if getattr(args, "seeds", None) is None else args.seeds,
        comm_factor=getattr(args, "comm_factor", None),
        growth_table=getattr(args, "growth_table", None),
        monitor_interval_s=getattr(args, "monitor_interval", None),
        cases=getattr(args, "cases", None),
        case=getattr(args, "case", None),
        all_orderings=getattr(args, "all_orderings", None),
        live=getattr(args, "live", None),
        grid=getattr(args, "grid", None) if args.command == "bench" else None,
        site=getattr(args, "site", None),
        background=_tuple(getattr(args, "background", None)),
        background_window=getattr(args, "background_window", None),
        background_offset=getattr(args, "background_offset", None),
        background_scale=getattr(args, "background_scale", None),
        traces=_tuple(getattr(args, "traces", None)),
        windows=getattr(args, "windows", None),
        trace=getattr(args, "trace", None),
        cluster=getattr(args, "cluster", None),
        poll_s=getattr(args, "poll", None),
    )
    progress_mode()  # a bad $GRIDCORE_PROGRESS is refused before the run, not in it
    # Log lines during the run are written above the progress bars (stderr), not through them.
    with logging_redirect_tqdm():
        result = entry.execute(options)
    if entry.plot is not None:
        _plot(args, result, entry.plot)
    _emit(args, result, entry.render(result))
    return 0 if entry.ok(result) else 1


def _tuple(values: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


def _log_load_arguments(p: argparse.ArgumentParser) -> None:
    """``gridcore experiment``'s options of real workload logs as other users' load."""
    p.add_argument(
        "--background",
        action="append",
        metavar="LOG.swf[@SITE]",
        help="every experiment with other users: a real workload log (SWF, .swf or .swf.gz)"
        " replayed as other users' jobs besides the experiment's own, in EASY-backfilled"
        " queues; @SITE puts all its jobs on that site, else a multi-partition log's"
        " partition p goes to the p-th site and a single-partition log to the first"
        " (repeatable)",
    )
    p.add_argument(
        "--background-window",
        metavar="START:END",
        help="--background: the log's jobs submitted in [START, END), seconds of the log or"
        " with a unit s, h or d (e.g. 100h:200h; either end may be left out; default all)",
    )
    p.add_argument(
        "--background-offset",
        metavar="S",
        help="--background: the log's time that is simulated time 0 (seconds, or s/h/d;"
        " default the window's start; a window starting earlier replays a warm-up)",
    )
    p.add_argument(
        "--background-scale",
        type=float,
        metavar="X",
        help="--background: load scale, the log's inter-arrival times divided by X (default 1)",
    )
    p.add_argument(
        "--traces",
        nargs="+",
        metavar="LOG.swf",
        help="selection-traces: the logs, one per cluster (or one multi-cluster log)",
    )
    p.add_argument(
        "--windows",
        type=int,
        metavar="N",
        help="selection-traces: arrival windows drawn from the logs' common span (default 30)",
    )


def _plot(
    args: argparse.Namespace, result: dict[str, Any], plot: Callable[[Any, str], None]
) -> None:
    path = f"out/{args.name}.png" if args.plot is None else args.plot
    if not path:
        return
    try:
        import matplotlib  # noqa: F401  (only to know whether the plot extra is installed)
    except ImportError:
        print(
            f"gridcore: no plot written ({path}): matplotlib is not installed"
            " (pip install 'gridcore[plot]')",
            file=sys.stderr,
        )
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    plot(result, path)
    result["plot"] = path


def _plan(args: argparse.Namespace) -> int:
    """Everything is read and checked before any plan: a bad file, site or grid exits 2
    and nothing is written (the state database is only read, and only for sizes the file
    leaves to the replica catalog)."""
    from gridcore.dataplan import planning
    from gridcore.dataplan.format import load_pipeline

    spec = load_pipeline(args.pipeline)
    grid = _grid(args)
    if args.site:
        grid.site(args.site)  # an unknown site is refused before the catalog is read
    measured: dict[str, Any] = {}
    refinement: list[str] | None = None
    if args.refine:
        spec, measured, refinement = _refined(args, spec, grid)
    canonical = planning.to_canonical(spec, _catalog_sizes(args, spec))
    plans, skipped = planning.plan_sites(canonical, grid, site=args.site, measured=measured)
    best, why = planning.choose_site(plans)
    data = best.as_json() | {"padding": canonical.padding.as_json()}
    if refinement is not None:
        data["refinement"] = refinement
    if not args.site:
        data["sites"] = {plan.site: plan.as_json() for plan in plans}
        data["site_choice"] = {"by": planning.DEFAULT_CHOOSER, "reason": why, "skipped": skipped}
    lines = _plan_header(spec, canonical)
    for plan in plans:
        lines += _plan_site_table(plan)
    if not args.site:
        lines += [f"chosen: {why}", *(f"skipped {n}: {e}" for n, e in skipped.items())]
    lines += [f"refined: {note}" for note in refinement or []]
    lines.append("(* the chooser's pick; times in seconds predicted by its models)")
    _emit(args, data, "\n".join(lines))
    return 0


def _refined(
    args: argparse.Namespace, spec: PipelineSpec, grid: GridSpec
) -> tuple[PipelineSpec, dict[str, Any], list[str]]:
    """``--refine``: the spec and per-site environment values measured by earlier runs
    (gridcore.engine.dataplan.refine_from_runs), read from an existing state database."""
    from sqlalchemy.engine import make_url

    from gridcore.engine.dataplan import refine_from_runs
    from gridcore.errors import StateError
    from gridcore.state.store import default_db_url, open_store

    url = make_url(args.db or default_db_url())
    if url.get_backend_name() == "sqlite" and not (url.database and Path(url.database).is_file()):
        raise StateError(f"--refine: there is no state database {url.database!r} (or give --db)")
    store = open_store(url.render_as_string(hide_password=False))
    try:
        store.check_migrated()
        found = refine_from_runs(spec, grid, store)
    finally:
        store.dispose()
    notes = list(found.notes) or ["nothing measured yet: the file's estimates are used"]
    return found.spec, {site: dict(v) for site, v in found.measured.items()}, notes


def _grid(args: argparse.Namespace) -> GridSpec:
    """The grid of --grid / $GRIDCORE_GRID, else the embedded default (GridRuntime's
    rule, without opening the state database)."""
    import os

    from gridcore.config import GRID_ENV, default_grid, load_grid
    from gridcore.state.store import state_dir

    path = args.grid or os.environ.get(GRID_ENV)
    return load_grid(path) if path else default_grid(state_dir())


def _catalog_sizes(args: argparse.Namespace, spec: PipelineSpec) -> dict[str, int]:
    """Sizes the file leaves out, from the replica catalog (the largest replica of each
    logical name); a name it does not know is left out for to_canonical to refuse by
    its field. Never creates a database: a SQLite file that does not exist is refused
    naming the file and the first field without a size."""
    unsized = spec.unsized_fields()
    if not unsized:
        return {}
    from sqlalchemy.engine import make_url

    from gridcore.dataplan.format import PipelineFieldError
    from gridcore.staging import ReplicaCatalog
    from gridcore.state.store import default_db_url, open_store

    url = make_url(args.db or default_db_url())
    if url.get_backend_name() == "sqlite" and not (url.database and Path(url.database).is_file()):
        (field, name), more = unsized[0], len(unsized) - 1
        raise PipelineFieldError(
            spec.source,
            field,
            f"not given, and there is no state database {url.database!r} whose replica"
            f" catalog could give the size of {name!r} (give size_bytes in the file, or"
            " --db)" + (f"; {more} more size(s) are left out too" if more else ""),
        )
    names = spec.unsized_logical_names()
    store = open_store(url.render_as_string(hide_password=False))
    try:
        store.check_migrated()
        catalog = ReplicaCatalog(store)
        found = {name: catalog.replicas(name) for name in names}
    finally:
        store.dispose()
    return {
        name: max(r.size_bytes for r in replicas) for name, replicas in found.items() if replicas
    }


def _plan_header(spec: PipelineSpec, canonical: CanonicalWorkload) -> list[str]:
    w, padding = canonical.workload, canonical.padding
    return [
        f"{spec.name} ({spec.source}): W = {w.W} pipelines, D = {w.D} depths; canonical"
        f" S_B {_bytes(int(w.S_B))}, S_P {_bytes(int(w.S_P))}, R_bar {w.R_bar:g} s,"
        f" SD_R {w.SD_R:.3g} s",
        f"padding: +{_bytes(padding.padding_bytes)} ({_bytes(padding.actual_bytes)} actual ->"
        f" {_bytes(padding.padded_bytes)} canonical)"
        + ("" if padding.padding_bytes else ", none: already canonical sizes"),
    ]


def _plan_site_table(plan: SitePlan) -> list[str]:
    """One site: its environment, then per strategy whether Eq. 1-4 allow it and each
    chooser's prediction, its pick starred (Remote only when it is the last resort)."""
    from gridcore.policies.dataplan import STORAGE_STRATEGIES, Strategy

    env, data = plan.environment, plan.as_json()
    choosers = list(data["predicted"])
    lines = [
        f"site {plan.site}: N_CPU {env.N_CPU}, S {_bytes(int(env.S))}, BW_R"
        f" {env.BW_R / 1e6:g} MB/s, BW_L {env.BW_L / 1e6:g} MB/s, F {env.F:g}/s,"
        f" slowness {plan.slowness:g}",
        f"  {'strategy':<10} {'feasible':<8} " + " ".join(f"{c:>16}" for c in choosers),
    ]
    remote = [Strategy.REMOTE] if Strategy.REMOTE.value in data["feasible"] else []
    for strategy in (*STORAGE_STRATEGIES, *remote):
        cells = " ".join(_plan_cell(data, chooser, strategy.value) for chooser in choosers)
        feasible = "yes" if strategy.value in data["feasible"] else "no"
        lines.append(f"  {strategy.value:<10} {feasible:<8} {cells}".rstrip())
    return lines


def _plan_cell(data: dict[str, Any], chooser: str, strategy: str) -> str:
    predicted = data["predicted"][chooser]
    if strategy not in predicted:
        text = "-"
    elif predicted[strategy] is None:
        text = "inf"
    else:
        text = f"{predicted[strategy]:,.1f} s"
    mark = " *" if data["picks"][chooser] == strategy else "  "
    return f"{text + mark:>16}"


def _serve(args: argparse.Namespace) -> int:
    from gridcore.api.server import serve
    from gridcore.state.store import open_store

    store = open_store(args.db, upgrade=True)
    url = store.engine.url.render_as_string(hide_password=True)
    log.info("gridcore serve: state database %s, listening on %s:%d", url, args.host, args.port)
    try:
        serve(store, args.host, args.port)
    finally:
        store.dispose()
    return 0


def _trace_parser(sub: Any) -> None:
    p = sub.add_parser("trace", help="workload logs (Standard Workload Format, docs/workloads.md)")
    actions = p.add_subparsers(dest="action", required=True)
    info = actions.add_parser(
        "info",
        help="a log's machine, max procs, job count, span, partitions and unknown fields",
        description="Read LOG (.swf or gzipped) once and summarize it. --json prints ONE JSON"
        " object: path, computer, installation, max_procs, max_partitions, unix_start_time,"
        " jobs, first_submit_s, last_submit_s, span_s, first_submit_utc, last_submit_utc,"
        " partitions {ID: jobs}, size_unknown, unknown {FIELD: jobs}, statuses {NAME: jobs}."
        " A malformed log: one line naming file, line and field, exit status 2.",
    )
    info.add_argument("log", metavar="LOG.swf[.gz]")
    info.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    info.set_defaults(handler=_trace_info)


def _trace_info(args: argparse.Namespace) -> int:
    from gridcore.workloads.summary import describe, summarize_log

    summary = summarize_log(args.log)
    _emit(args, summary.to_json(), "" if args.json else describe(summary))
    return 0


def _db(args: argparse.Namespace) -> int:
    from gridcore.state.store import open_store, upgrade_db

    store = open_store(args.db)
    revision = upgrade_db(store)
    url = store.engine.url.render_as_string(hide_password=True)
    _emit(args, {"revision": revision, "url": url}, f"state database {url} at revision {revision}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
