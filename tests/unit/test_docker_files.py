"""Static validation of the deployment under docker/ (no Docker engine needed).

The compose file is read with PyYAML (merge keys resolved) after the same `${VAR:-default}`
interpolation Compose performs, with an empty environment, i.e. the shipped defaults. These
checks are static and partial: no test runs `docker compose config` (no Docker engine or
CLI here), so a key Compose itself would reject beyond those checked below is not caught.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
SLURM_DOCKERFILE = DOCKER / "slurm" / "Dockerfile"
START_GRID = DOCKER / "slurm" / "start-grid.sh"
ENTRYPOINT = DOCKER / "airflow-entrypoint.sh"
INIT_SQL = DOCKER / "postgres" / "init-gridcore-db.sql"
GRID_FILE = DOCKER / "grid.toml"

AIRFLOW_VERSION = "3.3.2"
AIRFLOW_IMAGE = f"apache/airflow:{AIRFLOW_VERSION}-python3.11"
IMAGE_REPO_ROOT = PurePosixPath("/opt/gridcore")  # where docker/Dockerfile COPYs the repo

AIRFLOW_COMMANDS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
    "airflow-worker": "celery worker",
}
AIRFLOW_SERVICES = {"airflow-init", *AIRFLOW_COMMANDS}
SLURM_SERVICES = {"slurm-alpha", "slurm-beta", "slurm-gamma"}
SHARED_ENV = (
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CELERY__BROKER_URL",
    "AIRFLOW__CELERY__RESULT_BACKEND",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY",
    "GRIDCORE_DB_URL",
    "GRIDCORE_GRID",
    "GRIDCORE_TOKEN_DIR",
)
# Keys a single Airflow service may add on top of the shared environment.
PER_SERVICE_ENV = {
    "airflow-init": {"AIRFLOW_UID", "_AIRFLOW_WWW_USER_USERNAME", "_AIRFLOW_WWW_USER_PASSWORD"},
    "airflow-worker": {"DUMB_INIT_SETSID"},
}
DEPENDS_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}

_VAR = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable substitution (the subset of its syntax used here)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        val = env.get(name)
        unset = val is None or (op is not None and op.startswith(":") and val == "")
        if op in (":-", "-"):
            return arg if unset else str(val)
        if op in (":?", "?"):
            if unset:
                raise ValueError(f"required variable {name} is missing: {arg}")
            return str(val)
        if op in (":+", "+"):
            return "" if unset else arg
        return val or ""

    return _VAR.sub(sub, value)


def _interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(v, env) for v in node]
    return node


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict), "compose.yaml is not a mapping"
    return _interpolate_tree(data, {})


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs = compose.get("services")
    assert isinstance(svcs, dict) and svcs, "compose.yaml has no services"
    return svcs


@pytest.fixture(scope="module")
def grid() -> dict[str, Any]:
    with GRID_FILE.open("rb") as fh:
        return tomllib.load(fh)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment as Compose builds it: its ``env_file`` files, then its
    ``environment`` (which wins)."""
    from tests.deployment.deployment import read_env_file

    files = service.get("env_file") or []
    merged: dict[str, str] = {}
    for name in [files] if isinstance(files, str) else files:
        merged.update(read_env_file(DOCKER / name))
    env = service.get("environment") or {}
    if isinstance(env, list):  # KEY=VALUE list form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {**merged, **{str(k): "" if v is None else str(v) for k, v in env.items()}}


def test_airflow_services_take_the_shared_settings_file_unchanged(
    services: dict[str, Any],
) -> None:
    """docker/airflow.env is every Airflow service's env_file, and no service overrides
    one of its settings; the deployment tier starts its processes with the same file,
    the commands of these services, and departs from them only where it says why."""
    from tests.deployment.deployment import (
        NATIVE_ARGS,
        SETTINGS_FILE,
        TEST_OVERRIDES,
        compose_commands,
        shared_settings,
    )

    shared = shared_settings()
    assert SETTINGS_FILE == DOCKER / "airflow.env"
    assert shared["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    for name in AIRFLOW_SERVICES:
        assert services[name].get("env_file") == ["airflow.env"], name
        environment = services[name].get("environment") or {}
        overridden = set(environment) & set(shared)
        assert not overridden, f"{name} overrides {overridden}"
    assert compose_commands() == {n: c for n, c in AIRFLOW_COMMANDS.items()}
    assert set(NATIVE_ARGS) == set(AIRFLOW_COMMANDS.values())
    assert not set(TEST_OVERRIDES) & set(shared), "the tier must not silently change a setting"


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: {"condition": "service_started"} for name in deps}
    return {name: (spec or {}) for name, spec in deps.items()}


def mounts(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) for each short-syntax volume of a service."""
    out = []
    for vol in service.get("volumes") or []:
        assert isinstance(vol, str), f"use short volume syntax: {vol!r}"
        parts = vol.split(":")
        assert len(parts) in (2, 3), f"bad volume {vol!r}"
        out.append((parts[0], parts[1], len(parts) == 3 and "ro" in parts[2].split(",")))
    return out


def bind_source(source: str) -> Path | None:
    """Host path of a bind mount (relative to docker/, the compose project dir)."""
    if source.startswith((".", "/")):
        return (DOCKER / source).resolve()
    return None


def command_of(service: dict[str, Any]) -> str:
    cmd = service.get("command")
    return " ".join(cmd) if isinstance(cmd, list) else str(cmd or "")


def image_path(container_path: str) -> Path:
    """The repository file that docker/Dockerfile's `COPY . /opt/gridcore` puts there."""
    rel = PurePosixPath(container_path).relative_to(IMAGE_REPO_ROOT)
    return REPO / rel


# ---------------------------------------------------------------- compose: parsing, graph


def test_interpolation_helper() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d}/${UNSET:-d}/${EMPTY:-d}/${EMPTY-d}/$$H", env) == "x/d/d//$H"
    with pytest.raises(ValueError, match="UNSET"):
        interpolate("${UNSET:?set it}", env)


def test_compose_parses_with_expected_services(services: dict[str, Any]) -> None:
    expected = {"postgres", "redis", *AIRFLOW_SERVICES, *SLURM_SERVICES}
    missing = expected - services.keys()
    assert not missing, f"services missing from compose.yaml: {sorted(missing)}"
    assert not [k for k in services if "<<" in services[k]], "unresolved merge key"


# The Compose specification's top-level elements (extension fields start with "x-").
COMPOSE_TOP_LEVEL = {"version", "name", "include", "services", "networks", "volumes"}
COMPOSE_TOP_LEVEL |= {"configs", "secrets", "models"}


def test_compose_top_level_and_services_are_well_formed(compose: dict[str, Any]) -> None:
    unknown = {k for k in compose if k not in COMPOSE_TOP_LEVEL and not k.startswith("x-")}
    assert not unknown, f"not Compose top-level elements: {sorted(unknown)}"
    for name, svc in compose["services"].items():
        assert isinstance(svc, dict), f"service {name} is not a mapping"
        assert "image" in svc or "build" in svc, f"service {name} has neither image nor build"


def test_every_dependency_exists_with_a_valid_condition(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        for dep, spec in depends_on(svc).items():
            assert dep in services, f"{name} depends on undefined service {dep!r}"
            assert dep != name, f"{name} depends on itself"
            cond = spec.get("condition", "service_started")
            assert cond in DEPENDS_CONDITIONS, f"{name} -> {dep}: bad condition {cond!r}"
            if cond == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} health: none"
            if cond == "service_completed_successfully":
                assert services[dep].get("restart") in (None, "no"), f"{dep} must run once"


def test_dependencies_on_other_profiles_are_optional(services: dict[str, Any]) -> None:
    """Compose refuses a dependency on a service whose profile is off unless required=false."""
    for name, svc in services.items():
        mine = set(svc.get("profiles") or [])
        for dep, spec in depends_on(svc).items():
            theirs = set(services[dep].get("profiles") or [])
            if theirs and not (mine & theirs):
                assert spec.get("required") is False, (
                    f"{name} -> {dep} (profiles {sorted(theirs)}) needs required: false"
                )


def test_dependency_graph_has_no_cycle(services: dict[str, Any]) -> None:
    state: dict[str, int] = {}

    def visit(node: str, path: tuple[str, ...]) -> None:
        if state.get(node) == 2:
            return
        assert state.get(node) != 1, f"depends_on cycle: {' -> '.join((*path, node))}"
        state[node] = 1
        for dep in depends_on(services[node]):
            visit(dep, (*path, node))
        state[node] = 2

    for name in services:
        visit(name, ())


def test_named_volumes_are_declared(compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for source, target, _ in mounts(svc):
            assert target.startswith("/"), f"{name}: relative mount target {target!r}"
            host = bind_source(source)
            if host is None:
                assert source in declared, f"{name}: volume {source!r} is not declared"
            else:
                assert host.exists(), f"{name}: bind source {source} -> {host} does not exist"


def test_long_running_services_have_healthchecks(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        if name == "airflow-init":
            assert "restart" not in svc, "airflow-init is one-shot"
            continue
        check = svc.get("healthcheck")
        assert check and check.get("test"), f"{name} has no healthcheck"
        assert svc.get("restart") in ("always", "unless-stopped"), f"{name}: no restart policy"


# ---------------------------------------------------------------- compose: Airflow


def test_airflow_services_run_the_airflow3_commands(services: dict[str, Any]) -> None:
    for name, command in AIRFLOW_COMMANDS.items():
        assert command_of(services[name]) == command, f"{name} must run `{command}`"
        assert not services[name].get("profiles"), f"{name} must not hide behind a profile"
    init = command_of(services["airflow-init"])
    script = init.split()[-1]
    assert init.startswith("bash ") and image_path(script).is_file(), init
    commands = [
        line.strip()
        for line in image_path(script).read_text().splitlines()
        if line.strip() and not line.strip().startswith(("#", "echo "))
    ]
    for step in ("airflow db migrate", "gridcore db upgrade", "airflow users create"):
        assert any(c.startswith(step) for c in commands), f"airflow-init does not run `{step}`"


def test_airflow_services_share_one_image_built_from_the_repo(services: dict[str, Any]) -> None:
    images = {services[n].get("image") for n in AIRFLOW_SERVICES}
    builds = [services[n].get("build") for n in AIRFLOW_SERVICES]
    assert len(images) == 1 and None not in images, f"Airflow images differ: {images}"
    for build in builds:
        assert isinstance(build, dict), "Airflow services must build docker/Dockerfile"
        assert (DOCKER / build["context"]).resolve() == REPO, "build context must be the repo"
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


def test_airflow_services_share_executor_db_broker_env(services: dict[str, Any]) -> None:
    envs = {name: env_of(services[name]) for name in AIRFLOW_SERVICES}
    reference = envs["airflow-scheduler"]
    for key in SHARED_ENV:
        assert key in reference, f"shared env {key} missing"
        values = {name: env.get(key) for name, env in envs.items()}
        assert len(set(values.values())) == 1, f"{key} differs between services: {values}"
    for name, env in envs.items():
        extra = set(env) - set(reference) - PER_SERVICE_ENV.get(name, set())
        assert not extra, f"{name} has unshared env keys {sorted(extra)}"
        missing = set(reference) - set(env)
        assert not missing, f"{name} lacks shared env keys {sorted(missing)}"
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        assert reference[key], f"{key} must have a (shared) value"


def test_airflow_env_points_at_the_right_services(services: dict[str, Any]) -> None:
    env = env_of(services["airflow-scheduler"])
    pg_env = env_of(services["postgres"])
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false"

    conn = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert conn.scheme.startswith("postgresql") and conn.hostname == "postgres"
    assert conn.path.lstrip("/") == pg_env["POSTGRES_DB"]
    assert (conn.username, conn.password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"])

    backend = urlsplit(env["AIRFLOW__CELERY__RESULT_BACKEND"])
    assert backend.scheme == "db+postgresql" and backend.hostname == "postgres"

    broker = urlsplit(env["AIRFLOW__CELERY__BROKER_URL"])
    assert broker.scheme == "redis" and broker.hostname in services
    assert "redis" in services[broker.hostname]["image"]

    api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert api.hostname == "airflow-apiserver" and api.path == "/execution/"
    published = [str(p).rsplit(":", 1)[-1] for p in services["airflow-apiserver"]["ports"]]
    assert str(api.port) in published, "execution API port is not the api-server's port"
    assert any(
        str(p).split(":")[-2:] == ["8080", "8080"] for p in services["airflow-apiserver"]["ports"]
    ), "api-server must publish 8080"


def test_gridcore_db_is_the_database_the_init_script_creates(services: dict[str, Any]) -> None:
    sql = INIT_SQL.read_text()
    created = re.findall(r"(?im)^\s*CREATE\s+DATABASE\s+\"?(\w+)\"?", sql)
    assert created == ["gridcore"], f"init SQL must create exactly `gridcore`: {created}"
    pg = services["postgres"]
    pg_env = env_of(pg)
    assert pg["image"].split(":")[1].startswith("16"), "PostgreSQL 16"
    inits = [
        (bind_source(src), tgt)
        for src, tgt, _ in mounts(pg)
        if tgt.startswith("/docker-entrypoint-initdb.d/")
    ]
    assert any(src == INIT_SQL.resolve() and tgt.endswith(".sql") for src, tgt in inits), inits

    url = urlsplit(env_of(services["airflow-worker"])["GRIDCORE_DB_URL"])
    assert url.scheme == "postgresql+psycopg", "psycopg 3 (the [postgres] extra)"
    assert url.hostname == "postgres" and url.path.lstrip("/") == created[0]
    assert (url.username, url.password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"])
    airflow_db = urlsplit(env_of(services["airflow-worker"])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert url.path != airflow_db.path, "gridcore must not share Airflow's metadata database"


def test_grid_and_dags_reach_the_containers(services: dict[str, Any]) -> None:
    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        assert env["GRIDCORE_GRID"] == "/opt/gridcore/docker/grid.toml"
        assert image_path(env["GRIDCORE_GRID"]).resolve() == GRID_FILE.resolve()
        targets = {tgt: bind_source(src) for src, tgt, _ in mounts(services[name])}
        assert targets.get(env["GRIDCORE_GRID"]) == GRID_FILE.resolve()
        assert targets.get(env["AIRFLOW__CORE__DAGS_FOLDER"]) == (REPO / "dags").resolve()


def test_worker_is_scalable(services: dict[str, Any]) -> None:
    worker = services["airflow-worker"]
    assert "container_name" not in worker and "hostname" not in worker
    assert not worker.get("ports"), "a scaled worker cannot publish fixed host ports"


def test_workers_and_triggerer_wait_for_the_slurm_grid(services: dict[str, Any]) -> None:
    for name in ("airflow-worker", "airflow-triggerer"):
        deps = depends_on(services[name])
        for slurm in SLURM_SERVICES:
            assert deps.get(slurm, {}).get("condition") == "service_healthy", (name, slurm)


# ---------------------------------------------------------------- Dockerfiles


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_airflow_dockerfile_extends_the_official_image_correctly() -> None:
    ins = _instructions(DOCKERFILE)
    froms = [arg for word, arg in ins if word == "FROM"]
    assert froms == [AIRFLOW_IMAGE], f"FROM must pin {AIRFLOW_IMAGE}: {froms}"
    copies = [arg for word, arg in ins if word == "COPY"]
    assert any(re.fullmatch(r"(--chown=\S+\s+)?\.\s+/opt/gridcore/?", c) for c in copies), copies
    pip_at = next(i for i, (w, a) in enumerate(ins) if w == "RUN" and "pip install" in a)
    pip = ins[pip_at][1]
    assert '"/opt/gridcore[postgres]"' in pip or "'/opt/gridcore[postgres]'" in pip, pip
    assert "apache-airflow==${AIRFLOW_VERSION}" in pip, "pin Airflow to the image's version"
    users = [a for w, a in ins[:pip_at] if w == "USER"]
    assert users and users[-1] == "airflow", "pip must run as the airflow user"
    entry = next(a for w, a in ins if w == "ENTRYPOINT")
    script = re.search(r"/opt/gridcore/\S+\.sh", entry)
    assert script and image_path(script.group(0)).is_file(), entry


def test_pyproject_pins_the_same_airflow() -> None:
    with (REPO / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    extras = project["optional-dependencies"]
    assert f"apache-airflow=={AIRFLOW_VERSION}" in extras["airflow"]
    assert any(dep.startswith("psycopg") for dep in extras["postgres"])


def test_slurm_dockerfile_installs_the_needed_packages(services: dict[str, Any]) -> None:
    ins = _instructions(SLURM_DOCKERFILE)
    assert [a for w, a in ins if w == "FROM"] == ["debian:bookworm"]
    apt = " ".join(a for w, a in ins if w == "RUN" and "apt-get install" in a)
    for pkg in (
        "slurmctld",
        "slurmd",
        "slurm-client",
        "munge",
        "slurmrestd",
        "slurm-wlm-jwt-plugin",
        "curl",
    ):
        assert re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", apt), f"apt lacks {pkg}"
    for name in SLURM_SERVICES:
        build = services[name]["build"]
        ctx = (DOCKER / build["context"]).resolve()
        assert (ctx / build["dockerfile"]).resolve() == SLURM_DOCKERFILE.resolve()
        copied = [a.split()[0] for w, a in ins if w == "COPY"]
        assert all((ctx / src).exists() for src in copied), copied


# ---------------------------------------------------------------- Slurm grid and grid.toml


def test_slurm_services_are_behind_the_slurm_profile(services: dict[str, Any]) -> None:
    for name in SLURM_SERVICES:
        assert services[name].get("profiles") == ["slurm"], name
        assert env_of(services[name])["CLUSTER_NAME"] == name.removeprefix("slurm-")
    assert {n for n, s in services.items() if "slurm" in (s.get("profiles") or [])} == (
        SLURM_SERVICES
    )


def test_grid_toml_matches_the_slurm_services(grid: dict[str, Any], services: dict) -> None:
    assert grid["version"] == 1
    sites = grid["sites"]
    slurm_sites = {n for n, s in sites.items() if s["kind"] == "slurm"}
    assert {f"slurm-{n}" for n in slurm_sites} == SLURM_SERVICES
    assert any(s["kind"] == "local" for s in sites.values()), "one local site expected"
    airflow_env = env_of(services["airflow-worker"])
    for name in slurm_sites:
        site, svc = sites[name], services[f"slurm-{name}"]
        env = env_of(svc)
        url = urlsplit(site["url"])
        assert (url.scheme, url.hostname) == ("http", f"slurm-{name}"), site["url"]
        assert str(url.port) == env["SLURMRESTD_PORT"], "url port != slurmrestd port"
        assert site["processors"] == sum(int(c) for c in env["NODE_CPUS"].split())
        assert site["partition"] == env["PARTITION"]
        assert site["user"] == env["GRID_USER"]
        var = f"SLURM_{name.upper()}_TOKEN"  # the name airflow-entrypoint.sh exports
        assert site["token"] == {"env": var}
        assert var in airflow_env, f"{var} is not passed to the Airflow services"
        assert site["storage_dir"] == env["STORAGE_DIR"]
    expected_cpus = {"alpha": 16, "beta": 16, "gamma": 4}
    assert {n: sites[n]["processors"] for n in slurm_sites} == expected_cpus
    assert env_of(services["slurm-beta"])["NODE_CPUS"].split() == ["8", "8"]


def test_grid_storage_and_tokens_are_shared(grid: dict[str, Any], services: dict) -> None:
    def volume_at(svc: dict[str, Any], path: str) -> tuple[str, str, bool]:
        best = max(
            (m for m in mounts(svc) if path == m[1] or path.startswith(m[1].rstrip("/") + "/")),
            key=lambda m: len(m[1]),
            default=None,
        )
        assert best is not None, f"nothing mounted at {path}"
        return best

    for site in grid["sites"].values():
        sources = {volume_at(services[n], site["storage_dir"])[0] for n in AIRFLOW_SERVICES}
        if site["kind"] == "slurm":
            sources |= {volume_at(services[n], site["storage_dir"])[0] for n in SLURM_SERVICES}
        assert len(sources) == 1, f"{site['storage_dir']} is not one shared volume: {sources}"
    token_sources = set()
    for name in AIRFLOW_SERVICES:
        source, _, read_only = volume_at(
            services[name], env_of(services[name])["GRIDCORE_TOKEN_DIR"]
        )
        assert read_only, f"{name} must mount the token volume read-only"
        token_sources.add(source)
    for name in SLURM_SERVICES:
        token_sources.add(volume_at(services[name], env_of(services[name])["TOKEN_DIR"])[0])
    assert len(token_sources) == 1, f"token volumes differ: {token_sources}"


def test_grid_toml_loads_with_gridcore() -> None:
    from gridcore import config

    spec = config.load_grid(GRID_FILE)
    assert set(spec.site_names) == {"alpha", "beta", "gamma", "local"}
    assert spec.bandwidth("origin", "alpha") == 200.0


def test_bandwidth_matrix_names_known_sites(grid: dict[str, Any]) -> None:
    names = set(grid["sites"]) | {"origin"}
    for src, row in grid.get("bandwidth", {}).items():
        assert src in names, f"bandwidth from unknown site {src!r}"
        for dst, mbps in row.items():
            assert dst in names and dst != src, f"bandwidth {src}->{dst}"
            assert isinstance(mbps, float | int) and mbps > 0


def _render(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run(
        ["bash", str(START_GRID), "config"],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@pytest.mark.parametrize("name", sorted(SLURM_SERVICES))
def test_start_grid_renders_the_verified_slurm_conf(services: dict, name: str) -> None:
    env = env_of(services[name])
    result = _render(env)
    assert result.returncode == 0, result.stderr
    conf = dict(
        line.split("=", 1)
        for line in result.stdout.splitlines()
        if line and not line.startswith(("#", "NodeName", "PartitionName"))
    )
    assert conf["ClusterName"] == env["CLUSTER_NAME"]
    assert conf["ProctrackType"] == "proctrack/linuxproc"
    assert conf["TaskPlugin"] == "task/none"
    assert conf["SlurmdParameters"] == "config_overrides"
    assert conf["AuthAltTypes"] == "auth/jwt"
    assert conf["AuthAltParameters"].startswith("jwt_key=")
    assert conf["SlurmctldPort"] == env["SLURMCTLD_PORT"]
    assert conf["FirstJobId"] == env["FIRST_JOB_ID"]
    nodes = re.findall(r"^NodeName=(\S+) .*?Port=(\d+) CPUs=(\d+)", result.stdout, re.M)
    assert [int(c) for _, _, c in nodes] == [int(c) for c in env["NODE_CPUS"].split()]
    ports = [int(p) for _, p, _ in nodes] + [
        int(env["SLURMRESTD_PORT"]),
        int(conf["SlurmctldPort"]),
    ]
    assert len(set(ports)) == len(ports), f"port collision: {ports}"
    assert f"PartitionName={env['PARTITION']} " in result.stdout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CLUSTER_NAME": "Bad Name"}, "CLUSTER_NAME"),
        ({"CLUSTER_NAME": "x", "NODE_CPUS": "8 zero"}, "NODE_CPUS"),
        ({"CLUSTER_NAME": "x", "NODE_CPUS": "1 1", "SLURMD_PORT_BASE": "6819"}, "collision"),
    ],
)
def test_start_grid_rejects_bad_environment(env: dict[str, str], message: str) -> None:
    result = _render(env)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_entrypoint_exports_tokens_without_overriding(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "alpha.token").write_text("tok-alpha\n")
    (tokens / "beta.token").write_text("tok-beta\n")
    nxt = tmp_path / "next.sh"
    nxt.write_text('#!/usr/bin/env bash\nenv | grep "^SLURM_" | sort\necho "args=$*"\n')
    nxt.chmod(0o755)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GRIDCORE_TOKEN_DIR": str(tokens),
        "GRIDCORE_NEXT_ENTRYPOINT": str(nxt),
        "SLURM_BETA_TOKEN": "from-env",
        "SLURM_GAMMA_TOKEN": "",
    }
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "celery", "worker"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "SLURM_ALPHA_TOKEN=tok-alpha" in lines
    assert "SLURM_BETA_TOKEN=from-env" in lines
    assert "SLURM_GAMMA_TOKEN=" in lines
    assert lines[-1] == "args=celery worker"


@pytest.mark.parametrize("script", sorted(DOCKER.rglob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_pass_bash_n(script: Path) -> None:
    assert script.read_text().startswith("#!/usr/bin/env bash\n"), f"{script} needs a shebang"
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_all_docker_shell_scripts_are_collected() -> None:
    found = {p.relative_to(DOCKER).as_posix() for p in DOCKER.rglob("*.sh")}
    assert {"slurm/start-grid.sh", "airflow-entrypoint.sh", "airflow-init.sh"} <= found
