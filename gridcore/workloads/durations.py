"""Spans of a log's time as the command line gives them (``--window``,
``--background-window``, ``--background-offset``): one grammar for every option."""

from __future__ import annotations

import re

from gridcore.errors import ConfigError

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


def log_span(
    text: str, option: str, error: type[ConfigError] = ConfigError
) -> tuple[float | None, float | None]:
    """``START:END`` in log seconds (:func:`log_seconds`), either end left out
    (``None``); ``error`` naming ``option`` when it is not that, or END is not after
    START (a START left out counts as 0)."""
    start_text, sep, end_text = text.partition(":")
    if not sep:
        raise error(f"{option} {text!r}: not START:END (e.g. 0:2d, 3600:, 1h:90m)")

    def seconds(part: str, value: str) -> float:
        found = log_seconds(value)
        if found is None:
            raise error(
                f"{option} {text!r}: {part} {value.strip()!r} is not a duration ({DURATION_HINT})"
            )
        return found

    start = seconds("START", start_text) if start_text.strip() else None
    end = seconds("END", end_text) if end_text.strip() else None
    if end is not None and end <= (start or 0.0):
        raise error(f"{option} {text!r}: END must be after START")
    return start, end


__all__ = ["DURATION_HINT", "log_seconds", "log_span"]
