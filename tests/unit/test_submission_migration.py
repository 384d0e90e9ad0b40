"""Migration 0007 (submission keys) on SQLite: a database at 0006 with a half-made local
job (a pending row whose files were never written, as the old submit could leave) comes
out with that job failed instead of counting as queued work for ever, an install id, and
a key column that refuses a second job with the same key; downgrade and upgrade again."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, insert, select, text
from sqlalchemy.exc import IntegrityError

from gridcore.state import store as store_module
from gridcore.state.schema import local_jobs, meta


def _alembic(url: str) -> Config:
    cfg = Config(str(Path(store_module.__file__).parent / "migrations" / "alembic.ini"))
    cfg.set_main_option("script_location", str(Path(store_module.__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def _run(url: str, step: str, revision: str) -> None:
    engine = create_engine(url)
    cfg = _alembic(url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, step)(cfg, revision)
    engine.dispose()


def test_0007_fails_half_made_jobs_and_adds_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    _run(url, "upgrade", "0006")
    engine = create_engine(url)
    with engine.begin() as conn:
        for workdir, state in (("", "pending"), ("/some/dir", "pending"), ("", "completed")):
            conn.execute(
                text(
                    "INSERT INTO gc_local_jobs (site, name, processors, workdir, state,"
                    " submitted_at) VALUES ('local-a', 'j', 1, :w, :s, 1.0)"
                ),
                {"w": workdir, "s": state},
            )
    _run(url, "upgrade", "0007")
    with engine.begin() as conn:
        states = list(conn.execute(select(local_jobs.c.state).order_by(local_jobs.c.id)).scalars())
        install = conn.execute(select(meta.c.value)).scalar_one()
    assert states == ["failed", "pending", "completed"]
    assert len(install) == 12 and int(install, 16) >= 0
    row = {"site": "local-a", "name": "k", "processors": 1, "workdir": "/d", "state": "pending"}
    with engine.begin() as conn:
        conn.execute(insert(local_jobs).values(**row, submitted_at=2.0, key="gc-k"))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(local_jobs).values(**row, submitted_at=3.0, key="gc-k"))
    _run(url, "downgrade", "0006")
    _run(url, "upgrade", "0007")
    engine.dispose()
