"""Small statistics shared by the planners and the experiments: Student t intervals.

Below every layer that reports a mean with its interval (the simulation chooser of
:mod:`gridcore.dataplan.choosers`, the experiments' figures over seeds).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

_T_975: tuple[float, ...] = (
    # t(0.975, df) for df = 1..30, the two-sided 95 % quantiles of every printed t table.
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def half_width_95(values: Sequence[float]) -> float:
    """The 95 % Student t half-width of the mean of ``values`` (at least two)."""
    return student_t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def student_t_975(df: int) -> float:
    """t(0.975, ``df``): the printed table up to 30 degrees of freedom; beyond, the
    Cornish-Fisher expansion around the normal quantile (within 1e-4 of the exact value
    there, well under the table's own rounding)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T_975):
        return _T_975[df - 1]
    z = statistics.NormalDist().inv_cdf(0.975)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )
