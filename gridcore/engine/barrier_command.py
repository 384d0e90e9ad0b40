"""The command line a co-allocated component is submitted with: the start barrier
(:mod:`gridcore.barrier`) wrapped around the job's command (seed 000 Sec. 3.3: each
component runs "a small piece of code" that waits until all components have started).

A pure builder, apart from the I/O that submits it, so the exact argv and environment
are checked without a grid (STYLE.md 3: pure builders beside I/O).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from types import MappingProxyType

from sqlalchemy.engine import URL, make_url

DB_URL_ENV = "GRIDCORE_DB_URL"


@dataclass(frozen=True)
class BarrierCommand:
    """``argv`` runs the barrier, then ``/bin/sh -c COMMAND``; ``env`` is added to the
    component's environment."""

    argv: tuple[str, ...]
    env: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def shell(self) -> str:
        """``argv`` as one shell command line (what a site adapter runs)."""
        return shlex.join(self.argv)


def barrier_command(
    *,
    job_id: int,
    component: int,
    count: int,
    epoch: int,
    timeout_s: float,
    db_url: str | URL,
    python: str,
    command: str,
) -> BarrierCommand:
    """The barrier command of component ``component`` (of ``count``) of job ``job_id``'s
    placement ``epoch``: it waits ``timeout_s`` at most for the others.

    A database URL holding a password goes into the environment
    (``GRIDCORE_DB_URL``), never onto the command line, where any user of the site
    could read it in the process list.
    """
    url = make_url(db_url)
    argv = [python, "-m", "gridcore.barrier"]
    env = {
        "GRIDCORE_JOB": str(job_id),
        "GRIDCORE_COMPONENT": str(component),
        "GRIDCORE_COMPONENTS": str(count),
    }
    rendered = url.render_as_string(hide_password=False)
    if url.password:
        env[DB_URL_ENV] = rendered
    else:
        argv += ["--db", rendered]
    argv += ["--job", str(job_id), "--component", str(component)]
    argv += ["--epoch", str(epoch), "--timeout", f"{timeout_s:.0f}"]
    argv += ["--", "/bin/sh", "-c", command]
    return BarrierCommand(tuple(argv), MappingProxyType(env))
