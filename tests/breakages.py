"""Deliberate breakages: does the suite notice when a mechanism stops working?

Each :class:`Breakage` is one small edit that breaks one mechanism while everything still
imports and runs (a check removed, a comparison dropped, a factor changed). The runner
copies the checkout (tracked and untracked, not ignored, files as they are in the work
tree) into a temporary directory once per breakage, applies the edit there (it must match
exactly once, so a stale entry fails loudly), and runs the tests that guard that mechanism
against the copy. A breakage is *caught* when pytest reports failed tests (exit 1); a
collection error or no tests run is an error of the entry, not a catch. ``--control``
first runs every entry's tests on the unbroken copy, which must pass.

    python -m tests.breakages [--control] [NAME ...]   # JSON on stdout, exit 1 if any survives
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Breakage:
    """Replace ``old`` (exactly one occurrence) by ``new`` in ``path``; ``tests`` guard it."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


BREAKAGES = (
    Breakage(
        "claim-room-check-removed",
        "gridcore/state/capacity.py",
        "bindparam(\"b_processors\") == literal_column(\"0\"), bindparam(\"b_processors\") <= FREE",
        "bindparam(\"b_processors\") == literal_column(\"0\"), literal_column(\"1\") == 1",
        ("tests/unit/test_capacity_components.py", "tests/unit/test_capacity_volumes.py",
         "tests/unit/test_selection_engine.py", "tests/unit/test_batch_selection.py"),
    ),
    Breakage(
        "barrier-releases-before-everyone-registered",
        "gridcore/engine/barrier_pool.py",
        "    if any(r.port is None for r in rows):\n",
        "    if all(r.port is None for r in rows):\n",
        ("tests/unit/test_barrier.py",),
    ),
    Breakage(
        "barrier-ignores-an-abort",
        "gridcore/engine/barrier_pool.py",
        "    if job is None or job.state not in _LIVE_JOB or job.epoch != epoch:\n"
        "        return {\"state\": BarrierState.ABORT.value, \"peers\": []}\n",
        "    if job is None:\n"
        "        return {\"state\": BarrierState.ABORT.value, \"peers\": []}\n",
        ("tests/unit/test_barrier.py",),
    ),
    Breakage(
        "staging-compares-sizes-only",
        "gridcore/staging/transfer.py",
        "if size != source.size_bytes or checksum != source.checksum:",
        "if size != source.size_bytes:",
        ("tests/unit/test_staging.py",),
    ),
    Breakage(
        "retry-does-not-look-its-key-up",
        "gridcore/engine/submission.py",
        "found = adapter.find(job.key, since)",
        "found = None",
        ("tests/unit/test_exactly_once_retries.py", "tests/unit/test_submit_kills.py"),
    ),
    Breakage(
        "adoption-does-not-look-the-key-up",
        "gridcore/engine/submission.py",
        "found = adapter(site).find(key, since)",
        "found = None",
        ("tests/unit/test_exactly_once_retries.py", "tests/unit/test_coallocation_submit_kills.py"),
    ),
    Breakage(
        "fence-does-not-compare-the-token",
        "gridcore/engine/lease.py",
        "lc.holder == grant.holder, lc.token == grant.token)",
        "lc.holder == grant.holder)",
        ("tests/unit/test_coallocation_lease.py",),
    ),
    Breakage(
        "vjm-eq2-at-1x",
        "gridcore/policies/coreservation.py",
        "2.0 * max(t_avails, default=0.0)",
        "1.0 * max(t_avails, default=0.0)",
        ("tests/unit/test_coreservation_policy.py", "tests/unit/test_sim_coreservation.py"),
    ),
    Breakage(
        "dataplan-eq3-without-the-private-volume",
        "gridcore/policies/dataplan.py",
        "    return w.S_B + w.S_P * w.W + w.S_P\n",
        "    return w.S_B + w.S_P * w.W\n",
        ("tests/unit/test_dataplan_policy.py", "tests/unit/test_dataplan_stages.py"),
    ),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.breakages", description=__doc__)
    parser.add_argument("names", nargs="*", help="only these breakages (default: all)")
    parser.add_argument(
        "--control", action="store_true", help="first run each on the unbroken copy"
    )
    args = parser.parse_args(argv)
    chosen = [b for b in BREAKAGES if not args.names or b.name in args.names]
    unknown = set(args.names) - {b.name for b in BREAKAGES}
    if unknown:
        parser.error(f"unknown breakage(s): {', '.join(sorted(unknown))}")
    results: dict[str, Any] = {}
    for breakage in chosen:
        entry: dict[str, Any] = {}
        if args.control:
            entry["control"] = run(breakage, broken=False)
        entry.update(run(breakage, broken=True))
        results[breakage.name] = entry
        print(f"{breakage.name}: {entry['verdict']}", file=sys.stderr)
    caught = sum(r["verdict"] == "caught" for r in results.values())
    controls_ok = all(
        r.get("control", {}).get("verdict", "passed") == "passed" for r in results.values()
    )
    print(json.dumps({"breakages": len(results), "caught": caught, "controls_pass": controls_ok,
                      "results": results}, indent=2))  # fmt: skip
    return 0 if caught == len(results) and controls_ok else 1


def run(breakage: Breakage, *, broken: bool) -> dict[str, Any]:
    """The guarding tests against a copy of the checkout, with the edit applied if
    ``broken``: ``verdict`` is caught/survived (broken) or passed/failed (control)."""
    with tempfile.TemporaryDirectory(prefix="gridcore-breakage-") as tmp:
        copy = Path(tmp) / "tree"
        _copy_tree(copy)
        if broken:
            _apply(copy / breakage.path, breakage)
        env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
             "-o", "addopts=", *breakage.tests],
            cwd=copy, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        seconds = round(time.monotonic() - start, 1)
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.MULTILINE)
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode not in (0, 1):
        verdict = "error"
    elif broken:
        verdict = "caught" if proc.returncode == 1 else "survived"
    else:
        verdict = "passed" if proc.returncode == 0 else "failed"
    return {"verdict": verdict, "summary": summary, "failed": failed[:5], "seconds": seconds}


def _copy_tree(dest: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if not source.is_file():
            continue  # deleted in the work tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _apply(path: Path, breakage: Breakage) -> None:
    text = path.read_text()
    count = text.count(breakage.old)
    if count != 1 or breakage.old == breakage.new:
        raise SystemExit(
            f"breakage {breakage.name}: {breakage.path} holds the text to break {count} times"
            " (expected once): the entry is stale"
        )
    path.write_text(text.replace(breakage.old, breakage.new))


if __name__ == "__main__":
    raise SystemExit(main())
