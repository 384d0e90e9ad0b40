"""The ``gridcore`` command line. ``--json`` prints ONE JSON object on stdout; logs and
tables go to stderr in that case so the output can be piped."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gridcore.errors import GridError

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

    p = sub.add_parser("sites", help="idle/total processors, in-flight work and health per site")
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

    p = sub.add_parser("demo", help="an ensemble burst on the embedded local sites")
    common(p)
    p.add_argument("--members", type=int, default=10)
    p.add_argument("--steps", type=int, default=3000, help="work per member (time steps)")
    p.set_defaults(handler=_demo)

    p = sub.add_parser("experiment", help="reproduce a paper's experiment in the simulator")
    p.add_argument("name", choices=sorted(EXPERIMENTS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--runs", type=int, help="repetitions (stateful-selection default 20, else 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", help="PNG path (default out/<name>.png; '' to skip)")
    p.set_defaults(handler=_experiment)

    p = sub.add_parser("bench", help="measure decision throughput")
    p.add_argument("name", choices=["selection", "placement"])
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--pg-url", help="PostgreSQL URL (default $GRIDCORE_BENCH_PG_URL or the local test DB)"
    )
    p.add_argument("--decisions", type=int, default=2000)
    p.add_argument("--per-process", type=int, default=250)
    p.set_defaults(handler=_bench)

    p = sub.add_parser("db", help="state database maintenance")
    p.add_argument("action", choices=["upgrade"])
    common(p, grid=False)
    p.set_defaults(handler=_db)
    return parser


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
    from gridcore.engine.health import restore_site

    rt = _runtime(args)
    for name in args.restore:
        rt.grid.site(name)  # an unknown name is an error, not a silent no-op
        restore_site(rt.store, name)
    errors = {} if args.no_refresh else rt.refresh()
    rows = rt.site_rows()
    header = (
        f"{'site':<12} {'kind':<6} {'idle/total':>10} {'in-flight':>9} {'procs':>6}"
        f" {'others q':>8} {'usable':>6}"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.name:<12} {r.kind:<6} {f'{r.idle}/{r.total}':>10} {r.in_flight:>9} "
            f"{r.in_flight_processors:>6} {r.external_pending:>8}"
            f" {'yes' if r.usable and r.koala_usable else 'NO':>6}"
        )
        if r.last_error:
            lines.append(f"  last error: {r.last_error}")
        if not r.koala_usable:
            lines.append(
                f"  set aside by KOALA after {r.koala_errors} consecutive component errors;"
                f" probed until a probe job completes (or: gridcore sites --restore {r.name})"
            )
    data = {"sites": [vars(r) | {"refresh_error": errors.get(r.name)} for r in rows]}
    _emit(args, data, "\n".join(lines))
    return 0


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


def _stateful_selection(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gridcore.sim.experiments import plot_stateful_selection, stateful_selection_experiment

    result = stateful_selection_experiment(runs=args.runs or 20, seed=args.seed)
    _plot(args, result, plot_stateful_selection)
    lines = [f"{'protocol':<22} {'completion_s':>12} {'total_queue_s':>13} {'mean_queue_s':>12}"]
    for name, m in result["protocols"].items():
        lines.append(
            f"{name:<22} {m['completion_s']:>12.1f} {m['total_queue_s']:>13.1f}"
            f" {m['mean_queue_s']:>12.1f}"
        )
    return result, "\n".join(lines)


def _koala_placement(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gridcore.sim.coalloc_experiments import koala_placement_experiment, plot_koala_placement

    result = koala_placement_experiment(seed=args.seed, runs=args.runs or 1)
    _plot(args, result, plot_koala_placement)
    lines = [
        f"{'load':<4} {'policy':<4} {'response_s':>10} {'wait_s':>8} {'exec_s':>8} {'clusters':>8}"
    ]
    for load, policies in result["workloads"].items():
        for policy, m in policies.items():
            lines.append(
                f"{load:<4} {policy:<4} {m['mean_response_s']:>10.1f} {m['mean_wait_s']:>8.1f}"
                f" {m['mean_execution_s']:>8.1f} {m['mean_clusters_combined']:>8.2f}"
            )
    return result, "\n".join(lines)


def _koala_claiming(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from gridcore.sim.koala_experiments import koala_claiming_experiment, plot_koala_claiming

    result = koala_claiming_experiment(seed=args.seed)
    _plot(args, result, plot_koala_claiming)
    lines = [
        f"submitted {result['submitted']} completed {result['completed']}"
        f" component_failure_rate {result['component_failure_rate']:.3f}"
    ]
    for priority, m in result["priorities"].items():
        lines.append(
            f"{priority:<5} placement {m['mean_placement_s']:>9.1f} s"
            f"  start delay {m['mean_start_delay_s']:>9.1f} s"
        )
    return result, "\n".join(lines)


EXPERIMENTS: dict[str, Callable[[argparse.Namespace], tuple[dict[str, Any], str]]] = {
    "stateful-selection": _stateful_selection,
    "koala-placement": _koala_placement,
    "koala-claiming": _koala_claiming,
}


def _plot(args: argparse.Namespace, result: dict[str, Any], plot: Callable[..., None]) -> None:
    path = f"out/{args.name}.png" if args.plot is None else args.plot
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        plot(result, path)
        result["plot"] = path


def _experiment(args: argparse.Namespace) -> int:
    result, text = EXPERIMENTS[args.name](args)
    _emit(args, result, text)
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.name == "placement":
        from gridcore.bench import bench_placement

        placement = bench_placement()
        _emit(args, placement, " ".join(f"{k}={v:.4g}" for k, v in placement.items()))
        return 0
    from gridcore.bench import bench_selection

    result = bench_selection(args.pg_url, decisions=args.decisions, per_process=args.per_process)
    text = (
        f"decisions_per_s={result['decisions_per_s']} "
        f"concurrent_decisions_per_s={result['concurrent_decisions_per_s']} "
        f"overcommit_events={result['overcommit_events']}"
    )
    _emit(args, result, text)
    return 0 if result["overcommit_events"] == 0 and result["lost_rows"] == 0 else 1


def _db(args: argparse.Namespace) -> int:
    from gridcore.state.store import open_store, upgrade_db

    store = open_store(args.db)
    revision = upgrade_db(store)
    url = store.engine.url.render_as_string(hide_password=True)
    _emit(args, {"revision": revision, "url": url}, f"state database {url} at revision {revision}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
