"""The VJ center's whole app in process (no network), checked against its own OpenAPI
document on SQLite (tests/unit/test_api_openapi.py) and PostgreSQL (tests/postgres/
test_api_openapi_pg.py), issue 21's "done when" for the API:

- :func:`probe_every_route`: a table of probes, one row per operation of the document
  (a new route without a row fails): the right token is accepted; no token is 401 and
  another's token 403 (401 where there are no roles, the Grid page's); bad input 422;
  every answer's status and media type are listed for the operation and its JSON body
  validates against the documented schema (jsonschema);
- :func:`fuzz`: schemathesis generates requests for every operation from the same
  document, valid and schema-violating ones, sent with the operation's own token, with
  another's, with a junk one and with none: never a 5xx, every answer as documented,
  a schema-violating one refused, a refused token refused with 401/403.

After every refused request (4xx) every table of the state database is as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from gridcore.api.app import create_app
from gridcore.api.grid_routes import operator_token
from gridcore.state.store import Store
from tests.api_checks import seed, snapshot

OPERATOR_TOKEN = "operator-token-0123456789"
JUNK_TOKEN = "not-a-token-of-anything-at-all"


@dataclass
class InProcess:
    """The app on a seeded store (:func:`tests.api_checks.seed`), the operator's token
    for the Grid page, and its OpenAPI document."""

    store: Store
    app: FastAPI
    client: TestClient
    pilot_tokens: dict[int, str]
    component_tokens: dict[int, str]
    koala_job: int
    doc: dict[str, Any] = field(repr=False)

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        return snapshot(self.store)

    def path_values(self, template: str) -> dict[str, Any]:
        """Path parameters naming things that exist: the first pilot, component 0."""
        if template.startswith("/api/v1/pilots/"):
            return {"pilot_id": min(self.pilot_tokens)}
        if template.startswith("/api/v1/components/"):
            return {"job_id": self.koala_job, "epoch": 0, "idx": 0}
        if template.startswith("/grid/ti/"):
            return {"dag_id": "ensemble", "rest": "r1/member/0"}
        if template.startswith("/grid/static/"):
            return {"name": "grid.js"}
        return {}

    def own_token(self, template: str) -> str:
        """The token that opens ``template`` with :meth:`path_values`."""
        if template.startswith("/api/v1/pilots/"):
            return self.pilot_tokens[min(self.pilot_tokens)]
        if template.startswith("/api/v1/components/"):
            return self.component_tokens[0]
        return OPERATOR_TOKEN

    def others_token(self, template: str) -> str:
        """A real token that is not ``template``'s own: a component's for a pilot
        route, a pilot's for everything else."""
        if template.startswith("/api/v1/pilots/"):
            return self.component_tokens[0]
        return self.pilot_tokens[max(self.pilot_tokens)]


@contextlib.contextmanager
def in_process(store: Store) -> Iterator[InProcess]:
    """The seeded app with the operator's token :data:`OPERATOR_TOKEN`; long polls
    answer at once (the app is told it is closing), so a fuzzed ``wait`` costs nothing."""
    pilot_tokens, component_tokens, koala_job = seed(store)
    app = create_app(store, dashboard=operator_token(OPERATOR_TOKEN))
    app.state.center.closing.set()
    try:
        with TestClient(app) as client:
            yield InProcess(
                store, app, client, pilot_tokens, component_tokens, koala_job, app.openapi()
            )
    finally:
        store.dispose()


# -- the documented answers ---------------------------------------------------------------


def check_documented(doc: dict[str, Any], method: str, template: str, answer: Any) -> None:
    """``answer``'s status is listed for the operation, its media type too, and a JSON
    body validates against the schema the document gives for it."""
    responses = doc["paths"][template][method.lower()]["responses"]
    status = str(answer.status_code)
    assert status in responses, f"{method} {template}: {status} not in {sorted(responses)}"
    content = responses[status].get("content")
    media = answer.headers.get("content-type", "").split(";")[0].strip()
    if not content:
        assert not answer.content, f"{method} {template}: {status} has an undocumented body"
        return
    assert media in content, f"{method} {template}: {status} {media} not in {sorted(content)}"
    if media == "application/json":
        documented = {**content[media].get("schema", {}), "components": doc["components"]}
        jsonschema.Draft202012Validator(documented).validate(answer.json())


@dataclass(frozen=True)
class Probe:
    """How to call one operation: ``valid`` (request arguments the right token gets a
    2xx for), ``bad`` (arguments a 422 is right for; None where there is no input to
    get wrong), ``missing`` (a 404), ``roles``: whether another's real token is 403
    (pilot and component tokens) or 401 like any unknown one (the Grid page's)."""

    valid: dict[str, Any] = field(default_factory=dict)
    bad: dict[str, Any] | None = None
    missing: dict[str, Any] | None = None
    roles: bool = False
    secured: bool = True


REGISTER = {"host": "10.0.0.1", "port": 4000, "processors": 1}
PROBES: dict[tuple[str, str], Probe] = {
    ("POST", "/api/v1/pilots/{pilot_id}/register"): Probe(
        {"json": REGISTER}, {"json": {**REGISTER, "port": True}}, roles=True
    ),
    ("POST", "/api/v1/pilots/{pilot_id}/heartbeat"): Probe(
        bad={"path": {"pilot_id": "1.0"}}, roles=True
    ),
    ("GET", "/api/v1/pilots/{pilot_id}/work"): Probe(
        {"params": {"wait": 0}}, {"params": {"wait": -1}}, roles=True
    ),
    ("POST", "/api/v1/pilots/{pilot_id}/started"): Probe(
        bad={"path": {"pilot_id": "%201"}}, roles=True
    ),
    ("POST", "/api/v1/pilots/{pilot_id}/result"): Probe(
        {"json": {"exit_code": 0}}, {"json": {"exit_code": True}}, roles=True
    ),
    ("POST", "/api/v1/components/{job_id}/{epoch}/{idx}/register"): Probe(
        {"json": {"host": "10.0.0.2", "port": 4001}},
        {"json": {"host": "h h", "port": 4001}},
        roles=True,
    ),
    ("GET", "/api/v1/components/{job_id}/{epoch}/{idx}/peers"): Probe(
        {"params": {"wait": 0}}, {"params": {"wait": "soon"}}, roles=True
    ),
    ("POST", "/api/v1/components/{job_id}/{epoch}/{idx}/released"): Probe(
        bad={"path": {"idx": "+0"}}, roles=True
    ),
    ("GET", "/api/v1/health"): Probe(secured=False),
    ("GET", "/api/v1/grid"): Probe(bad={"params": {"recent": 0}}),
    # issue 21 item 10: a bad map_index was a 422 whose detail was a string, where the
    # document says a list
    ("GET", "/api/v1/grid/task"): Probe(
        {"params": {"dag_id": "ensemble", "task_id": "member", "map_index": "0"}},
        {"params": {"dag_id": "ensemble", "task_id": "member", "map_index": "-2"}},
    ),
    ("GET", "/grid/"): Probe(),
    ("GET", "/grid"): Probe(),
    ("GET", "/grid/ti/{dag_id}/{rest}"): Probe(
        bad={"path": {"rest": "r1/member/x1"}}, missing={"path": {"rest": "member"}}
    ),
    ("GET", "/grid/static/{name}"): Probe(missing={"path": {"name": "app.py"}}),
    ("POST", "/grid/login"): Probe(
        {"data": {"token": OPERATOR_TOKEN}}, missing=None, secured=False
    ),
    ("POST", "/grid/logout"): Probe(secured=False),
}


def operations(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, ops in doc["paths"].items() for method in ops]


def probe_every_route(center: InProcess) -> None:
    """Every operation of the document through its row of :data:`PROBES`."""
    assert sorted(operations(center.doc)) == sorted(PROBES), "a route without a probe"
    for (method, template), probe in PROBES.items():
        own, other = center.own_token(template), center.others_token(template)
        if probe.secured:
            _refused(center, method, template, probe.valid, None, 401)
            _refused(center, method, template, probe.valid, JUNK_TOKEN, 401)
            _refused(center, method, template, probe.valid, other, 403 if probe.roles else 401)
        if probe.bad is not None:
            _refused(center, method, template, probe.bad, own, 422)
        if probe.missing is not None:
            _refused(center, method, template, probe.missing, own, 404)
        answer = _call(center, method, template, probe.valid, own)
        assert answer.status_code < 400, (method, template, answer.status_code, answer.text)
        check_documented(center.doc, method, template, answer)


def _refused(
    center: InProcess,
    method: str,
    template: str,
    request: dict[str, Any],
    token: str | None,
    status: int,
) -> None:
    before = center.snapshot()
    answer = _call(center, method, template, request, token)
    assert answer.status_code == status, (method, template, token, answer.text)
    check_documented(center.doc, method, template, answer)
    assert center.snapshot() == before, f"{method} {template} refused ({status}) changed a row"


def _call(
    center: InProcess, method: str, template: str, request: dict[str, Any], token: str | None
) -> Any:
    arguments = dict(request)
    path = template.format(**(center.path_values(template) | arguments.pop("path", {})))
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return center.client.request(method, path, headers=headers, follow_redirects=False, **arguments)


# -- schemathesis -------------------------------------------------------------------------

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass(frozen=True)
class Variant:
    """Whose token a fuzzed request carries: ``own`` (the path is fixed to what the
    token opens), ``other`` (the same path, another's real token), ``junk`` or
    ``none`` (the path generated too)."""

    name: str
    token: Callable[[InProcess, str], str | None]
    fixed_path: bool


VARIANTS = (
    Variant("own", InProcess.own_token, fixed_path=True),
    Variant("other", InProcess.others_token, fixed_path=True),
    Variant("junk", lambda _center, _template: JUNK_TOKEN, fixed_path=False),
    Variant("none", lambda _center, _template: None, fixed_path=False),
)


def fuzz(center: InProcess, max_examples: int) -> list[str]:
    """schemathesis on every operation, every :data:`VARIANTS`, valid and
    schema-violating requests (``max_examples`` each, derandomized): what went wrong,
    one line each (empty: nothing)."""
    api = schemathesis.openapi.from_asgi("/openapi.json", center.app)
    # the token is ours to choose per variant, not a header to generate
    api.config.generation.update(with_security_parameters=False)
    problems: list[str] = []
    for result in api.get_all_operations():
        operation = result.ok()
        for variant in VARIANTS:
            for mode in _modes(center.doc, operation.method.upper(), operation.path, variant):
                _fuzz_one(center, operation, variant, mode, max_examples, problems)
    return list(dict.fromkeys(problems))  # each once, in the order found


def _modes(
    doc: dict[str, Any], method: str, template: str, variant: Variant
) -> list[GenerationMode]:
    """Positive always; negative where something can be made invalid: a body, a query
    parameter, or (when the path is generated) a path parameter that is not any text."""
    definition = doc["paths"][template][method.lower()]
    inputs = [
        p
        for p in definition.get("parameters", [])
        if p["in"] == "query"
        or (p["in"] == "path" and not variant.fixed_path and p["schema"].get("type") != "string")
    ]
    has_body = "requestBody" in definition
    return [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if inputs or has_body else [])


def _fuzz_one(
    center: InProcess,
    operation: Any,
    variant: Variant,
    mode: GenerationMode,
    max_examples: int,
    problems: list[str],
) -> None:
    """Run ``max_examples`` cases of ``operation`` in ``mode`` with ``variant``'s token;
    what went wrong is appended to ``problems``."""
    method, template = operation.method.upper(), operation.path
    secured = "security" in center.doc["paths"][template][method.lower()]
    token = variant.token(center, template)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    fixed = center.path_values(template) if variant.fixed_path else None
    label = f"{operation.label} [{variant.name} token, {mode.value}]"
    checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: problems are collected
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=fixed))
    def one(case: Any) -> None:
        before = center.snapshot()
        try:
            answer = case.call(headers=headers)
        except Exception as exc:  # the app raised: a 500 under a real server
            problems.append(f"{label}: {type(exc).__name__}: {exc}")
            return
        try:
            case.validate_response(answer, checks=checks, headers=headers)
        except BaseException as exc:  # schemathesis's FailureGroup is a BaseExceptionGroup
            problems.append(f"{label}: {str(exc).splitlines()[2:6]}")
        status = answer.status_code
        # refused, whatever the rest says (a 400 or 422 may come first: bad input is
        # refused before the token is looked up; what schemathesis counts as an integer,
        # 2.0, the API does not)
        if secured and variant.name != "own" and status not in (400, 401, 403, 422):
            problems.append(f"{label}: a request without its own token answered {status}")
        if 400 <= status < 500 and center.snapshot() != before:
            problems.append(f"{label}: refused with {status} but a row changed")

    one()
