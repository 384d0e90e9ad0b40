"""Progress of long work (experiments, benchmarks) on stderr, never on stdout.

stdout carries results only (with ``--json`` exactly one JSON object), so every bar and
every progress line goes to ``sys.stderr`` through tqdm. ``$GRIDCORE_PROGRESS`` says when:

* ``auto`` (the default): on a terminal's stderr, and only for work still running after
  :data:`SHOW_AFTER_S` seconds (a quick run prints nothing); never into a pipe or a log
  file, where a redrawn bar is noise;
* ``always``: on stderr whatever it is (a CI log, a test reading it), from the start;
* ``never``: no bars (the lines of :func:`note` are still written).

Bars are transient (``leave=False``): a nested loop's bar disappears when it ends, and
the table printed after the run is not pushed away by finished bars.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any, TypeVar

from tqdm import tqdm

from gridcore.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

PROGRESS_ENV = "GRIDCORE_PROGRESS"
SHOW_AFTER_S = 2.0
# A redraw at most twice a second: cheap beside any loop worth a bar.
_REDRAW_S = 0.5


class ProgressMode(StrEnum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


def progress_mode() -> ProgressMode:
    """The mode ``$GRIDCORE_PROGRESS`` asks for (module docstring); a bad value is a
    :class:`~gridcore.errors.ConfigError` naming the variable."""
    value = os.environ.get(PROGRESS_ENV, "").strip().lower() or ProgressMode.AUTO.value
    try:
        return ProgressMode(value)
    except ValueError:
        choices = ", ".join(m.value for m in ProgressMode)
        raise ConfigError(f"${PROGRESS_ENV}: must be one of {choices}, got {value!r}") from None


def progress(
    iterable: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it"
) -> Iterable[T]:
    """``iterable``, drawing a bar on stderr while it is consumed (``total``: its length
    when ``len()`` cannot tell)."""
    return tqdm(iterable, **_options(desc, total, unit))


def run_stages(desc: str, stages: Mapping[str, Callable[[], R]]) -> dict[str, R]:
    """Run ``stages`` in order under one bar naming the stage under way; their results
    by name. For benchmarks: the bar moves between timed regions, never inside one."""
    results: dict[str, R] = {}
    bar = tqdm(**_options(desc, len(stages), "stage"))
    try:
        for name, stage in stages.items():
            bar.set_postfix_str(name)
            results[name] = stage()
            bar.update(1)
    finally:
        bar.close()
    return results


def note(text: str) -> None:
    """One line on stderr that does not break the bars being drawn."""
    tqdm.write(text, file=sys.stderr)


def _options(desc: str, total: int | None, unit: str) -> dict[str, Any]:
    """tqdm's arguments for a bar on stderr as the mode says (sys.stderr read now: a
    test or a caller may have replaced it)."""
    mode = progress_mode()
    return {
        "desc": desc,
        "total": total,
        "unit": unit,
        "file": sys.stderr,
        "leave": False,
        "mininterval": _REDRAW_S,
        "dynamic_ncols": True,
        "disable": mode is ProgressMode.NEVER
        or (mode is ProgressMode.AUTO and not _is_terminal(sys.stderr)),
        "delay": 0.0 if mode is ProgressMode.ALWAYS else SHOW_AFTER_S,
    }


def _is_terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())
