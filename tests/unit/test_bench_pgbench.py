"""The pgbench baseline of `gridcore bench selection`: the script pgbench runs is the very
statement a decision commits, and without pgbench the figure is null with a reason, never
a number made up."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from gridcore.engine import selection as selection_engine
from gridcore.experiments import bench_selection as bench
from gridcore.model import GridSpec, SiteKind, SiteSpec


def test_the_pgbench_script_is_the_decision_statement_with_pgbench_variables() -> None:
    script = bench.pgbench_script(bench.make_grid(100, 0))
    lines = script.splitlines()
    assert lines[:2] == [r"\set site random(0, 99)", r"\set processors random(1, 8)"]
    statement = "\n".join(lines[2:])
    assert "%(" not in statement and statement.endswith(";")
    # the same SQL once the placeholders are put back
    placeholders = re.sub(r"%\((\w+)\)s", "?", selection_engine.pg_decision_sql())
    assert statement.count("INSERT INTO") == placeholders.count("INSERT INTO") == 2
    assert "UPDATE gc_sites SET claimed" in statement
    assert "('site' || lpad(CAST(:site AS text), 3, '0'))" in statement


def test_a_grid_named_otherwise_is_refused_rather_than_benchmarked_empty() -> None:
    """Claims on site names that do not exist would match no row: fast, and empty."""
    sites = tuple(SiteSpec(f"x{i}", SiteKind.SLURM, 64) for i in range(3))
    renamed = bench.BenchGrid(GridSpec(sites, MappingProxyType({})), {s.name: 64 for s in sites})
    with pytest.raises(ValueError, match="named as make_grid does"):
        bench.pgbench_script(renamed)


def test_without_pgbench_the_rate_is_null_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    monkeypatch.setattr(bench, "PGBENCH", "/nonexistent/pgbench")
    result = bench.bench_pgbench("postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert result == {
        "pgbench_tps": None,
        "pgbench_reason": "pgbench not on PATH nor at /nonexistent/pgbench",
    }
