"""The one transfer-time formula (policies/transfer.py), table-driven."""

from __future__ import annotations

import math

import pytest

from gridcore.errors import ConfigError
from gridcore.model import MB, JobRequest
from gridcore.policies.transfer import (
    free_bandwidth,
    job_transfer_seconds,
    link_seconds,
    transfer_seconds,
    uniform_bandwidth,
)


@pytest.mark.parametrize(
    ("size_bytes", "rate", "seconds"),
    [
        pytest.param(4 * 10**9, 12.5, 320.0, id="4 GB over 100 Mbit/s"),
        pytest.param(800 * MB, 100.0, 8.0, id="800 MB at 100 MB/s"),
        pytest.param(0, 0.0, 0.0, id="nothing to move needs no link"),
        pytest.param(MB, math.inf, 0.0, id="free link"),
        pytest.param(MB, 0.0, math.inf, id="no link"),
        pytest.param(MB, -1.0, math.inf, id="negative rate is no link"),
    ],
)
def test_transfer_seconds(size_bytes: int, rate: float, seconds: float) -> None:
    assert transfer_seconds(size_bytes, rate) == seconds


def test_link_within_a_site_is_free_without_asking_the_bandwidth() -> None:
    def never(src: str, dst: str) -> float:
        raise AssertionError("asked")

    assert link_seconds(10 * MB, "a", "a", never) == 0.0
    assert link_seconds(10 * MB, "a", "b", lambda s, d: 5.0) == 2.0


def test_job_transfer_is_upload_plus_download_over_each_direction() -> None:
    request = JobRequest("j", 1, 60.0, input_bytes=100 * MB, output_bytes=50 * MB)
    rates = {("origin", "s"): 10.0, ("s", "origin"): 25.0}
    assert job_transfer_seconds(request, "s", lambda a, b: rates[a, b]) == 12.0
    assert job_transfer_seconds(request, "s", free_bandwidth) == 0.0


def test_uniform_bandwidth() -> None:
    backbone = uniform_bandwidth(12.5)
    assert (backbone("a", "b"), backbone("a", "a")) == (12.5, math.inf)
    with pytest.raises(ConfigError, match="must be > 0"):
        uniform_bandwidth(0.0)
