"""The deployment of ``docker/compose.yaml``, started natively on this host (issue 11
item 6): Airflow 3.3's api-server, scheduler, dag-processor, triggerer and two Celery
workers, Redis (the server on 127.0.0.1:6379) as the broker, PostgreSQL (127.0.0.1:5432)
for Airflow's metadata and gridcore's state.

What it runs comes from the project's own files, not from a second description:

- the settings that do not depend on the host are ``docker/airflow.env``, the file
  compose.yaml gives every Airflow service (``env_file``);
- the processes are the commands of compose.yaml's Airflow services, plus only what one
  host needs that containers do not (:data:`NATIVE_ARGS`: an address and port for the
  api-server, a distinct Celery host name per worker, no per-process log server since
  every process shares one log folder);
- the initialisation is ``docker/airflow-init.sh`` itself (``airflow db migrate``,
  ``gridcore db upgrade``, the admin user);
- :data:`TEST_OVERRIDES` is the one place the tier departs from the deployment's
  settings, each with its reason.

Every process runs in its own session (process group) and is stopped through it; the two
databases and the Redis database are created for one run and dropped afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
import requests
import yaml
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
SETTINGS_FILE = DOCKER / "airflow.env"
COMPOSE_FILE = DOCKER / "compose.yaml"
INIT_SCRIPT = DOCKER / "airflow-init.sh"
BIN = Path(sys.executable).parent
AIRFLOW_BIN = str(BIN / "airflow")

PG_ADMIN_URL = os.environ.get(
    "GRIDCORE_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
ADMIN_USER = "admin"

# What a compose service's command needs on one host (``{port}`` and ``{name}`` are
# filled in per process).
NATIVE_ARGS: dict[str, list[str]] = {
    "api-server": ["--host", "127.0.0.1", "--port", "{port}", "--workers", "1"],
    "scheduler": ["--skip-serve-logs"],
    "dag-processor": [],
    "triggerer": ["--skip-serve-logs"],
    "celery worker": ["--celery-hostname", "{name}@%h", "--skip-serve-logs"],
}
# Where the tier differs from docker/airflow.env, and why.
TEST_OVERRIDES: dict[str, str] = {
    # A task whose worker was killed is found by its missing heartbeat: after 20 s here
    # instead of the default 300 s, so the test does not wait five minutes.
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    # A task the killed worker had taken from Redis but not started stays queued (late
    # acks: its message is redelivered only after the broker's visibility timeout) until
    # the scheduler sends it again: after 90 s here instead of the default 600 s, which
    # the test otherwise waits out whenever the kill catches such a task (seen: a
    # batch_pipeline task queued for 10 min, the test took 757 s).
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "90",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "10",
}
STOP_GRACE_S = 15.0


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines as Compose reads an ``env_file`` (comments and blanks skipped)."""
    settings: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}:{number}: not KEY=VALUE: {line!r}")
        settings[key.strip()] = value.strip()
    return settings


def shared_settings() -> dict[str, str]:
    return read_env_file(SETTINGS_FILE)


def compose_commands() -> dict[str, str]:
    """Each long-running Airflow service of compose.yaml -> its ``airflow`` command."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    commands = {}
    for name, service in services.items():
        if not name.startswith("airflow-") or name == "airflow-init":
            continue
        command = service["command"]
        commands[name] = command if isinstance(command, str) else " ".join(command)
    return commands


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Deployment:
    """The running deployment; :meth:`up` starts it, :meth:`down` stops and drops it."""

    base: Path
    workers: int = 2
    port: int = field(default_factory=free_port)
    token: str = ""
    # a leading "-": docker/airflow-init.sh once passed such a password (1 in 64 of
    # token_urlsafe's) as "--password VALUE", which Airflow's parser read as an option
    password: str = field(default_factory=lambda: "-" + secrets.token_urlsafe(12))
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    redis_db: int = field(default_factory=lambda: 8 + secrets.randbelow(8))
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    # -- names and URLs ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def airflow_db(self) -> str:
        return f"gc_deploy_airflow_{self.suffix}"

    @property
    def gridcore_db(self) -> str:
        return f"gc_deploy_state_{self.suffix}"

    def _pg_url(self, database: str, driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://postgres@127.0.0.1:5432/{database}"

    @property
    def gridcore_db_url(self) -> str:
        return self._pg_url(self.gridcore_db)

    @property
    def forcing_dir(self) -> Path:
        return self.base / "forcing"

    @property
    def log_dir(self) -> Path:
        return self.base / "services"

    def worker_names(self) -> list[str]:
        return [f"worker{i}" for i in range(1, self.workers + 1)]

    # -- starting -----------------------------------------------------------------------

    def host_settings(self) -> dict[str, str]:
        """What compose.yaml sets per container, for this host."""
        from cryptography.fernet import Fernet

        airflow_db = self._pg_url(self.airflow_db)
        return {
            "AIRFLOW_HOME": str(self.base / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.base / "logs"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": airflow_db,  # psycopg 3 is async too
            "AIRFLOW__CELERY__BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.redis_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{airflow_db}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "GRIDCORE_DB_URL": self.gridcore_db_url,
            "GRIDCORE_HOME": str(self.base / "gridcore"),
            "GRIDCORE_FORCING_DIR": str(self.forcing_dir),
            # the test restarts the triggerer, which may lose the forcing file's event:
            # the file is announced again after 30 s rather than the default 600 s
            "GRIDCORE_FORCING_REEMIT_S": "30",
            "GRIDCORE_CENTER_URL": f"{self.url}/gridcore",
            # docker/airflow-init.sh: the uid that owns the logs, and the admin user
            "AIRFLOW_UID": str(os.getuid()),
            "_AIRFLOW_WWW_USER_USERNAME": ADMIN_USER,
            "_AIRFLOW_WWW_USER_PASSWORD": self.password,
        }

    def up(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.forcing_dir.mkdir(exist_ok=True)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        inherited["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env = {**inherited, **shared_settings(), **self.host_settings(), **TEST_OVERRIDES}
        self._create_databases()
        self._run_init()
        commands = compose_commands()
        for service, command in commands.items():
            if command == "celery worker":
                for name in self.worker_names():
                    self.start(name, command)
            else:
                self.start(service.removeprefix("airflow-"), command)
        self.wait_http(f"{self.url}/api/v2/monitor/health", 180.0)
        self.token = self.login()

    def _create_databases(self) -> None:
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for database in (self.airflow_db, self.gridcore_db):
                conn.execute(text(f'CREATE DATABASE "{database}"'))
        engine.dispose()
        self.redis().flushdb()

    def redis(self) -> redis.Redis:
        return redis.Redis(REDIS_HOST, REDIS_PORT, db=self.redis_db, socket_timeout=5)

    def _run_init(self) -> None:
        with open(self.log_dir / "init.log", "wb") as out:
            done = subprocess.run(
                ["bash", str(INIT_SCRIPT)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=600,
                check=False,
            )
        if done.returncode != 0:
            raise RuntimeError(f"docker/airflow-init.sh failed:\n{self.log_tail('init', 60)}")

    def start(self, name: str, command: str) -> None:
        """Start ``airflow <command>`` (a compose service's command) as process ``name``."""
        args = [
            arg.format(port=self.port, name=name)
            for arg in shlex.split(command) + NATIVE_ARGS[command]
        ]
        with open(self.log_dir / f"{name}.log", "ab") as out:
            self.processes[name] = subprocess.Popen(
                [AIRFLOW_BIN, *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def login(self) -> str:
        response = requests.post(
            f"{self.url}/auth/token",
            json={"username": ADMIN_USER, "password": self.password},
            timeout=30,
        )
        response.raise_for_status()
        token: str = response.json()["access_token"]
        return token

    def wait_http(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(requests.RequestException):
                if requests.get(url, timeout=5).status_code == 200:
                    return
            time.sleep(1.0)
        tail = self.log_tail("api-server")
        raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s\n{tail}")

    # -- operating ----------------------------------------------------------------------

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = requests.request(
            method,
            f"{self.url}/api/v2{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
            **kwargs,
        )
        if response.status_code >= 400:
            raise AssertionError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json() if response.content else None

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}
        if dead:
            tails = "\n".join(f"--- {n} ---\n{self.log_tail(n)}" for n in dead)
            raise RuntimeError(f"Airflow process(es) exited: {dead}\n{tails}")

    def kill(self, name: str) -> list[int]:
        """SIGKILL process ``name`` and everything it started (a machine lost): the pids.
        The tree is frozen first (:meth:`freeze`), so nothing it forks meanwhile escapes."""
        victims = sorted(self.freeze(name))
        proc = self.processes.pop(name)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        return victims

    def freeze(self, name: str) -> set[int]:
        """SIGSTOP process ``name`` and everything under it, so that what it runs can be
        read without changing under the reader: the pids stopped (:meth:`thaw` them). A
        stopped process forks nothing, so the tree is listed again until every process
        in it has been stopped."""
        root = psutil.Process(self.processes[name].pid)
        stopped: set[int] = set()
        while True:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return stopped
            fresh = [p for p in tree if p.pid not in stopped]
            if not fresh:
                return stopped
            for process in fresh:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signal.SIGSTOP)
                stopped.add(process.pid)

    @staticmethod
    def thaw(stopped: set[int]) -> None:
        """SIGCONT exactly what :meth:`freeze` stopped (a process moved out of the tree
        meanwhile included)."""
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def restart(self, name: str, command: str) -> None:
        """Stop ``name`` gracefully (SIGTERM, as an operator restarting it) and start it
        again."""
        proc = self.processes.pop(name)
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self.start(name, command)

    def descends_from(self, pid: int, name: str) -> bool:
        """True if ``pid`` runs under process ``name`` (a task inside that worker)."""
        root = self.processes[name].pid
        try:
            return pid == root or any(p.pid == root for p in psutil.Process(pid).parents())
        except psutil.NoSuchProcess:
            return False

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- stopping -----------------------------------------------------------------------

    def down(self) -> None:
        for proc in self.processes.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.processes.values():
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        self.processes.clear()
        with contextlib.suppress(redis.RedisError):
            self.redis().flushdb()
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for database in (self.airflow_db, self.gridcore_db):
                conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        engine.dispose()


@contextlib.contextmanager
def running(base: Path, workers: int = 2) -> Iterator[Deployment]:
    deployment = Deployment(base, workers)
    try:
        deployment.up()
        yield deployment
    finally:
        deployment.down()


def reachable() -> str | None:
    """Why the tier cannot run here, or None."""
    try:
        engine = create_engine(PG_ADMIN_URL)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # any driver or connection failure
        return f"PostgreSQL at {PG_ADMIN_URL} unreachable: {exc}"
    try:
        redis.Redis(REDIS_HOST, REDIS_PORT, socket_timeout=5).ping()
    except redis.RedisError as exc:
        return f"Redis at {REDIS_HOST}:{REDIS_PORT} unreachable: {exc}"
    missing = [
        name
        for name in ("airflow.providers.celery", "airflow.providers.fab")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        return f"not installed (the dev extra has them): {missing}"
    return None


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
