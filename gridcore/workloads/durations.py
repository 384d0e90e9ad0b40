"""Spans of a log's time as the command line gives them (``--window``,
``--background-window``, ``--background-offset``): one grammar for every option."""

from __future__ import annotations

import re

DURATION_HINT = "seconds, or a number with s, m, h or d: 36h"
"""What a refusal says a duration is (each option's error names the option first)."""

_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhd]?)\s*")


def log_seconds(text: str) -> float | None:
    """``text`` in seconds: a number >= 0 with an optional unit ``s``, ``m``, ``h`` or
    ``d`` (``1.5h`` is 5400); ``None`` when it is no duration, for the caller to refuse
    with its own option's name."""
    match = _DURATION.fullmatch(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT_S[match.group(2)]


__all__ = ["DURATION_HINT", "log_seconds"]
