"""The command line a co-allocated component is submitted with: the start barrier
(:mod:`gridcore.barrier`) wrapped around the job's command (KOALA 2005 Sec. 3.3: each
component runs "a small piece of code" that waits until all components have started).

A pure builder, apart from the I/O that submits it, so the exact argv and environment
are checked without a grid (STYLE.md 3: pure builders beside I/O).

The barrier talks to the VJ center's HTTP API, never to the state database (DESIGN.md:
code on a cluster holds a token scoped to itself, not the database's URL). Its token
goes into the environment (``GRIDCORE_COMPONENT_TOKEN``), never onto the command line,
where any user of the site could read it in the process list.
"""

from __future__ import annotations

import shlex
import urllib.parse
from dataclasses import dataclass, field
from types import MappingProxyType

from gridcore.barrier import TOKEN_ENV
from gridcore.errors import RequestError

__all__ = ["TOKEN_ENV", "BarrierCommand", "barrier_command"]


@dataclass(frozen=True)
class BarrierCommand:
    """``argv`` runs the barrier, then ``/bin/sh -c COMMAND``; ``env`` is added to the
    component's environment (its token among it)."""

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
    center_url: str,
    token: str,
    python: str,
    command: str,
    bind: str | None = None,
) -> BarrierCommand:
    """The barrier command of component ``component`` (of ``count``) of job ``job_id``'s
    placement ``epoch``, reporting to the center at ``center_url`` with ``token``: it
    waits ``timeout_s`` at most for the others. ``bind``: the data port's address
    (default the barrier's, 127.0.0.1; ``0.0.0.0`` advertises the address of the route
    to the center, for a component on another host)."""
    if urllib.parse.urlsplit(center_url).scheme not in ("http", "https"):
        raise RequestError(f"barrier center URL must be http(s), not {center_url!r}")
    if not token:
        raise RequestError(f"component {component} of job {job_id}: no barrier token")
    argv = [python, "-m", "gridcore.barrier", "--center", center_url.rstrip("/")]
    argv += ["--job", str(job_id), "--component", str(component)]
    argv += ["--epoch", str(epoch), "--timeout", f"{timeout_s:.0f}"]
    if bind is not None:
        argv += ["--bind", bind]
    argv += ["--", "/bin/sh", "-c", command]
    env = {
        "GRIDCORE_JOB": str(job_id),
        "GRIDCORE_COMPONENT": str(component),
        "GRIDCORE_COMPONENTS": str(count),
        TOKEN_ENV: token,
    }
    return BarrierCommand(tuple(argv), MappingProxyType(env))
