"""The operators build their requests through gridcore's request models
(gridcore.validation): a malformed argument fails the task without retries, naming the
field, before the operator opens the grid or writes a row."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from gridcore_airflow.operators.coallocation import CoAllocationOperator
from gridcore_airflow.operators.site_job import SiteJobOperator


def site_job(**kwargs: Any) -> SiteJobOperator:
    return SiteJobOperator(**{"task_id": "member", "command": "true", **kwargs})


def coallocate(**kwargs: Any) -> CoAllocationOperator:
    return CoAllocationOperator(
        **{"task_id": "job", "command": "true", "components": [2, 2], **kwargs}
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param(
            {"stream": "s" * 129},
            r"\.member: stream: must be at most 128 characters",
            id="stream longer than its column",
        ),
        pytest.param(
            {"command": "true\x00"},
            r"\.member: job\.command: must not be blank or contain a NUL byte",
            id="command with a NUL byte",
        ),
        pytest.param(
            {"env": {"A": "x\x00y"}},
            r"\.member: job\.env\.A: must be a string of at most 131072 characters without"
            r" a NUL byte",
            id="environment value with a NUL byte",
        ),
        pytest.param(
            {"runtime_s": float("inf")},
            r"\.member: request\.runtime_s: must be a finite number >= 0, got inf",
            id="infinite runtime",
        ),
    ],
)
def test_site_job_operator_refuses_through_the_models(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AirflowFailException, match=message):
        site_job(**kwargs).plan_job({})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param(
            {"input_file": "../etc/passwd"},
            r"\.job: request\.input_file\.logical_name: must be a relative path",
            id="input file escaping with ..",
        ),
        pytest.param(
            {"command": "true\x00"},
            r"\.job: command: must not be blank or contain a NUL byte",
            id="command with a NUL byte",
        ),
        pytest.param(
            {"quota": float("inf")},
            r"quota: must be in \(0, 1\], got inf",
            id="infinite quota",
        ),
    ],
)
def test_coallocate_operator_refuses_through_the_models(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(AirflowFailException, match=message):
        coallocate(**kwargs).plan_request({})


def test_valid_arguments_pass_unchanged() -> None:
    plan = site_job(processors=2, runtime_s=5, env={"A": "1"}, stream="ens").plan_job({})
    assert (plan.request.processors, plan.request.runtime_s, plan.stream) == (2, 5.0, "ens")
    assert dict(plan.submission.env) == {"A": "1"} and plan.submission.command == "true"
    request, policy, quota = coallocate(quota=0.5).plan_request({})
    assert [c.size for c in request.components] == [2, 2] and quota == 0.5
    assert policy.value == "CM"
