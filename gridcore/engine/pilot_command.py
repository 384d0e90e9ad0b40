"""The shell text a pilot's site job runs: :mod:`gridcore.pilot`'s source, embedded as a
quoted heredoc and fed to ``python3 -`` (VJM Sec. 3.1: "VJM has no extra requirements
for local sites"; a cluster needs python3 and nothing of gridcore).

A pure builder beside the I/O that submits it (STYLE.md 3), like
:mod:`gridcore.engine.barrier_command`. The pilot's token is NOT in this text: the
submitter puts it in the job's environment (``GRIDCORE_PILOT_TOKEN``, with
``GRIDCORE_PILOT_PROCESSORS``), so it never shows in a process list.
"""

from __future__ import annotations

import functools
import shlex
import urllib.parse
from importlib import resources

from gridcore.errors import RequestError

DELIMITER = "GRIDCORE_PILOT_SOURCE_END"
"""The heredoc's end line. Quoted (``<<'...'``), so the shell expands nothing inside;
:func:`pilot_source` refuses a source that contains it."""


def pilot_command(
    center_url: str,
    pilot_id: int,
    python: str = "python3",
    *,
    bind: str | None = None,
    advertise: str | None = None,
) -> str:
    """The job text of pilot ``pilot_id`` reporting to ``center_url``: ``exec``s
    ``python -`` (so the site's signals reach the pilot itself) with the source on stdin.
    ``bind``/``advertise``: the pilot's ``--bind``/``--advertise`` (default: all
    addresses, and the address of the route to the center)."""
    if urllib.parse.urlsplit(center_url).scheme not in ("http", "https"):
        raise RequestError(f"pilot center URL must be http(s), not {center_url!r}")
    # -I -S: the pilot is stdlib only; no site-packages, .pth files or PYTHON* variables
    # of the site to load (or to be changed by): it starts in milliseconds, not tenths.
    argv = [
        python,
        "-I",
        "-S",
        "-",
        "--center",
        center_url.rstrip("/"),
        "--pilot",
        str(int(pilot_id)),
    ]
    if bind is not None:
        argv += ["--bind", bind]
    if advertise is not None:
        argv += ["--advertise", advertise]
    source = pilot_source()
    return f"exec {shlex.join(argv)} <<'{DELIMITER}'\n{source}{DELIMITER}\n"


@functools.cache
def pilot_source() -> str:
    """:mod:`gridcore.pilot`'s source, ending in a newline (read once per process)."""
    source = resources.files("gridcore").joinpath("pilot.py").read_text(encoding="utf-8")
    if DELIMITER in source:
        raise RequestError(f"gridcore/pilot.py contains the heredoc delimiter {DELIMITER}")
    return source if source.endswith("\n") else source + "\n"
