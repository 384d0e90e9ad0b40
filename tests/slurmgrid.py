"""Start and stop a real three-cluster Slurm grid on localhost for the test suite.

Layout (see ``DEFAULT_LAYOUT``): ``alpha`` = one 16-CPU node, ``beta`` = two 8-CPU nodes
(two slurmd processes), ``gamma`` = one 4-CPU node. Each cluster has its own slurm.conf,
ports, JWT key, slurmrestd and job id range; one munged serves all three.

Every daemon's PID file is recorded in ``<dir>/daemons.json`` BEFORE the daemon starts, so
``stop`` can always find what a (possibly half-finished) ``start`` launched. Daemons are
stopped only through those PID files, never by process name.

Command line (from the repository root)::

    python -m tests.slurmgrid start --dir DIR   # prints the grid TOML path
    python -m tests.slurmgrid stop --dir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from gridcore.errors import GridError

APT_PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    "slurmrestd",
    "slurm-wlm-jwt-plugin",
)
API_VERSION = "v0.0.38"
MANIFEST = "daemons.json"
ENV_FILE = "grid.env"
TOML_FILE = "grid.toml"
PARTITION = "debug"
# Daemons live in /usr/sbin, which a non-login PATH may lack.
_SEARCH_PATH = os.pathsep.join(["/usr/sbin", "/usr/bin", "/sbin", "/bin", os.environ["PATH"]])
_BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "scontrol", "squeue", "scancel")
_JWT_PLUGIN_GLOB = "/usr/lib/*/slurm-wlm/auth_jwt.so"
# Scan below the kernel's ephemeral range (32768+) so outgoing connections made by the
# daemons themselves cannot grab a port between our probe and the daemon's bind.
_PORT_SCAN = (20000, 30000)
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


class SlurmGridError(GridError):
    """The test grid could not be started (or a daemon misbehaved)."""


@dataclass(frozen=True)
class ClusterLayout:
    """One cluster to start: its nodes' CPU counts and where its job ids begin."""

    name: str
    node_cpus: tuple[int, ...]
    first_job_id: int
    origin_bandwidth_mbps: float
    slowness: float = 1.0

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-n{i + 1}" for i in range(len(self.node_cpus)))


DEFAULT_LAYOUT = (
    ClusterLayout("alpha", (16,), 1000, 200.0),
    ClusterLayout("beta", (8, 8), 2000, 100.0),
    ClusterLayout("gamma", (4,), 3000, 50.0),
)


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: where its REST API is and how to authenticate to it."""

    name: str
    rest_url: str
    token: str = field(repr=False)
    token_env: str
    conf: Path
    cpus: int
    nodes: tuple[str, ...]
    storage_dir: Path
    first_job_id: int

    def cli_env(self) -> dict[str, str]:
        """Environment for Slurm CLI tools (squeue, scontrol) aimed at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": _SEARCH_PATH}


@dataclass
class SlurmGrid:
    """A running grid. ``env`` maps the TOML's token env var names to the tokens."""

    dir: Path
    clusters: tuple[SlurmCluster, ...]
    grid_toml: Path
    env: dict[str, str] = field(repr=False)
    # slurmrestd runs in the foreground as our child; kept to reap it on stop.
    children: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def cluster(self, name: str) -> SlurmCluster:
        for cluster in self.clusters:
            if cluster.name == name:
                return cluster
        raise SlurmGridError(f"no cluster {name!r} in grid {self.dir}")


@dataclass(frozen=True)
class _Ports:
    ctld: int
    slurmd: tuple[int, ...]
    rest: int


# --------------------------------------------------------------------------- checks


def ensure_slurm_installed() -> None:
    """Raise SlurmGridError naming the apt packages if any needed binary is missing."""
    missing = [b for b in _BINARIES if shutil.which(b, path=_SEARCH_PATH) is None]
    if not list(Path("/").glob(_JWT_PLUGIN_GLOB.lstrip("/"))):
        missing.append("auth_jwt.so")
    if missing:
        raise SlurmGridError(
            f"Slurm is not installed (missing: {', '.join(missing)}); install with: "
            "apt-get install -y --no-install-recommends " + " ".join(APT_PACKAGES)
        )


def _binary(name: str) -> str:
    found = shutil.which(name, path=_SEARCH_PATH)
    if found is None:
        ensure_slurm_installed()
        raise SlurmGridError(f"{name} not found on {_SEARCH_PATH}")
    return found


def _ensure_world_traversable(base_dir: Path) -> None:
    """slurmrestd runs as nobody and must read the slurm.conf files, and munged wants its
    socket reachable by all: every directory down to ``base_dir`` must be o+x."""
    for directory in (base_dir, *base_dir.parents):
        if not directory.stat().st_mode & stat.S_IXOTH:
            raise SlurmGridError(
                f"{directory} is not world-executable (mode "
                f"{stat.S_IMODE(directory.stat().st_mode):o}); slurmrestd (user nobody) and "
                f"munged need every directory above {base_dir} to be o+x -- use a directory "
                "such as one made by tempfile.mkdtemp() under /tmp and chmod 755"
            )


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc.strerror})"
    return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 0.0.0.0 (slurmctld/slurmd cannot bind loopback)."""
    low, high = _PORT_SCAN
    candidates = list(range(low, high))
    random.shuffle(candidates)
    found: list[int] = []
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise SlurmGridError(f"could not find {count} free TCP ports in {low}-{high}")


# --------------------------------------------------------------------------- manifest


def _record_daemon(base_dir: Path, pid_file: Path, program: str, conf: Path | None = None) -> None:
    """Append a daemon to the manifest before it starts (so stop can find it)."""
    entries = _read_manifest(base_dir)
    entry = {"pid_file": str(pid_file), "program": program}
    if conf is not None:
        entry["conf"] = str(conf)
    entries.append(entry)
    (base_dir / MANIFEST).write_text(json.dumps(entries, indent=1))


def _read_manifest(base_dir: Path) -> list[dict[str, str]]:
    manifest = base_dir / MANIFEST
    if not manifest.exists():
        return []
    loaded: list[dict[str, str]] = json.loads(manifest.read_text())
    return loaded


# --------------------------------------------------------------------------- stopping


def _proc_state(pid: int) -> str | None:
    """The process's state letter, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in field 2 may hold spaces; the state follows its closing ')'.
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    state = _proc_state(pid)
    # A zombie has exited; it only waits for its parent (possibly init) to reap it.
    return state is not None and state != "Z"


def _pid_of(pid_file: Path, program: str) -> int | None:
    """The live PID recorded in ``pid_file`` if that process really is ``program``."""
    try:
        pid = int(pid_file.read_text().split()[0])
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        return None
    # Guards against PID reuse: only signal the daemon we wrote the file for.
    if comm != program[:15] or not _alive(pid):
        return None
    return pid


def _wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    remaining = list(pids)
    deadline = time.monotonic() + timeout_s
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = [p for p in remaining if _alive(p)]
    return remaining


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue


def _squeue_ids(env: dict[str, str]) -> list[str]:
    argv = [_binary("squeue"), "--noheader", "--format=%i"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=20)
    return done.stdout.split() if done.returncode == 0 else []


def _cancel_all_jobs(entries: Sequence[dict[str, str]]) -> None:
    """Cancel every live job: a job's slurmstepd outlives slurmd and slurmctld."""
    envs = [
        {**os.environ, "SLURM_CONF": e["conf"]}
        for e in entries
        if "conf" in e and _pid_of(Path(e["pid_file"]), e["program"]) is not None
    ]
    for env in envs:
        ids = _squeue_ids(env)
        if ids:
            subprocess.run([_binary("scancel"), *ids], env=env, capture_output=True, timeout=20)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while envs and time.monotonic() < deadline:
        envs = [env for env in envs if _squeue_ids(env)]
        time.sleep(0.1)


def stop_grid_dir(base_dir: Path) -> None:
    """Stop every daemon listed in ``base_dir``'s manifest, by PID file. Idempotent."""
    entries = _read_manifest(base_dir)
    _cancel_all_jobs(entries)
    # Slurm daemons first (reverse start order), munged last: they talk through it.
    munge = [e for e in entries if e["program"] == "munged"]
    slurm = [e for e in reversed(entries) if e["program"] != "munged"]
    for group in (slurm, munge):
        found = [(_pid_of(Path(e["pid_file"]), e["program"]), e) for e in group]
        pids = [pid for pid, _ in found if pid is not None]
        _signal_all(pids, signal.SIGTERM)
        stuck = _wait_gone(pids, _STOP_TIMEOUT_S)
        _signal_all(stuck, signal.SIGKILL)
        _wait_gone(stuck, _STOP_TIMEOUT_S)
        for _, entry in found:
            Path(entry["pid_file"]).unlink(missing_ok=True)


def stop_grid(grid: SlurmGrid) -> None:
    """Stop the grid's daemons (by their PID files only) and reap our children."""
    stop_grid_dir(grid.dir)
    for child in grid.children:
        try:
            child.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # Its PID file was lost; it is still our own child, so kill it by handle.
            child.kill()
            child.wait()
    grid.children.clear()


# --------------------------------------------------------------------------- starting


def _run_daemon(argv: Sequence[str], log: Path, what: str, env: dict[str, str]) -> None:
    """Run a self-daemonising program; its launcher returns once it has forked."""
    with log.open("ab") as out:
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, timeout=20
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmGridError(f"{what} did not daemonise within 20 s\n{_tail(log)}") from exc
    if done.returncode != 0:
        raise SlurmGridError(f"{what} exited with {done.returncode}\n{_tail(log)}")


def _wait_for(check: Callable[[], bool], what: str, logs: Sequence[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    tails = "\n".join(_tail(log) for log in logs)
    raise SlurmGridError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{tails}")


def _start_munge(base_dir: Path) -> Path:
    mdir = base_dir / "munge"
    mdir.mkdir(exist_ok=True)
    # munged refuses a socket directory that is not exactly 0711.
    mdir.chmod(0o711)
    key = mdir / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    socket_path = mdir / "munge.socket"
    pid_file = mdir / "munged.pid"
    log = mdir / "munged.log"
    _record_daemon(base_dir, pid_file, "munged")
    argv = [
        _binary("munged"),
        f"--key-file={key}",
        f"--socket={socket_path}",
        f"--pid-file={pid_file}",
        f"--log-file={log}",
        f"--seed-file={mdir / 'munged.seed'}",
    ]
    _run_daemon(argv, mdir / "launch.log", "munged", dict(os.environ))
    _wait_for(socket_path.exists, "the munge socket", [log], _START_TIMEOUT_S)
    return socket_path


def _slurm_conf(layout: ClusterLayout, cdir: Path, munge_socket: Path, ports: _Ports) -> str:
    lines = [
        f"ClusterName={layout.name}",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ports.ctld}",
        f"SlurmdPort={ports.slurmd[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}",
        "CredType=cred/munge",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={cdir / 'jwt.key'}",
        f"StateSaveLocation={cdir / 'state'}",
        f"SlurmdSpoolDir={cdir / 'spool' / '%n'}",
        f"SlurmctldPidFile={cdir / 'slurmctld.pid'}",
        f"SlurmdPidFile={cdir / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={cdir / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={cdir / 'log' / 'slurmd-%n.log'}",
        # proctrack/cgroup fails here (no freezer cgroup); linuxproc needs nothing.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        f"FirstJobId={layout.first_job_id}",
        # Keeps finished jobs visible to the REST API for 5 minutes.
        "MinJobAge=300",
        # Lets a node claim more CPUs than this machine has.
        "SlurmdParameters=config_overrides",
    ]
    for node, cpus, port in zip(layout.node_names, layout.node_cpus, ports.slurmd, strict=True):
        lines.append(
            f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname=localhost Port={port} "
            f"CPUs={cpus} RealMemory=4000 State=UNKNOWN"
        )
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _start_controller_and_nodes(
    base_dir: Path, layout: ClusterLayout, munge_socket: Path, ports: _Ports
) -> Path:
    cdir = base_dir / layout.name
    for sub in ("state", "spool", "log", "storage"):
        (cdir / sub).mkdir(parents=True, exist_ok=True)
    jwt_key = cdir / "jwt.key"
    jwt_key.write_bytes(secrets.token_bytes(32))
    jwt_key.chmod(0o600)
    conf = cdir / "slurm.conf"
    conf.write_text(_slurm_conf(layout, cdir, munge_socket, ports))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    _record_daemon(base_dir, cdir / "slurmctld.pid", "slurmctld", conf)
    _run_daemon(
        [_binary("slurmctld"), "-f", str(conf), "-i"],
        cdir / "log" / "launch-slurmctld.log",
        f"slurmctld of {layout.name}",
        env,
    )
    for node in layout.node_names:
        _record_daemon(base_dir, cdir / f"slurmd-{node}.pid", "slurmd")
        _run_daemon(
            [_binary("slurmd"), "-f", str(conf), "-N", node],
            cdir / "log" / f"launch-slurmd-{node}.log",
            f"slurmd {node} of {layout.name}",
            env,
        )
    return conf


def _fetch_token(conf: Path, name: str) -> str:
    """A 24 h JWT for root, retried while slurmctld is still coming up."""
    env = {**os.environ, "SLURM_CONF": str(conf)}
    argv = [_binary("scontrol"), "token", "username=root", "lifespan=86400"]
    deadline = time.monotonic() + _START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=20)
        out = done.stdout.strip()
        if done.returncode == 0 and out.startswith("SLURM_JWT="):
            return out.split("=", 1)[1]
        last = done.stderr.strip() or out
        time.sleep(0.2)
    log = conf.parent / "log" / "slurmctld.log"
    raise SlurmGridError(f"no JWT from slurmctld of {name}: {last}\n{_tail(log)}")


def _start_rest(grid: SlurmGrid, conf: Path, name: str, port: int) -> None:
    cdir = conf.parent
    pid_file = cdir / "slurmrestd.pid"
    log = cdir / "log" / "slurmrestd.log"
    _record_daemon(grid.dir, pid_file, "slurmrestd")
    argv = [
        _binary("slurmrestd"),
        "-f",
        str(conf),
        "-u",
        "nobody",
        "-g",
        "nogroup",
        "-a",
        "rest_auth/jwt",
        "-s",
        "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36",
        f"127.0.0.1:{port}",
    ]
    # Without SLURM_JWT=daemon slurmrestd rejects every client token.
    env = {**os.environ, "SLURM_CONF": str(conf), "SLURM_JWT": "daemon"}
    with log.open("ab") as out:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True
        )
    grid.children.append(child)
    # slurmrestd stays in the foreground and writes no PID file; we write it for stop.
    pid_file.write_text(f"{child.pid}\n")


def _rest_get(session: requests.Session, cluster: SlurmCluster, path: str) -> dict[str, Any]:
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token}
    url = f"{cluster.rest_url}/slurm/{API_VERSION}/{path}"
    try:
        resp = session.get(url, headers=headers, timeout=5)
        body: dict[str, Any] = resp.json() if resp.status_code == 200 else {}
    except (requests.RequestException, ValueError):
        return {}
    return body


def _nodes_idle(session: requests.Session, cluster: SlurmCluster) -> bool:
    nodes = _rest_get(session, cluster, "nodes").get("nodes", [])
    # A node that just registered can read "idle" with flags such as NOT_RESPONDING.
    ready = {n.get("name") for n in nodes if n.get("state") == "idle" and not n.get("state_flags")}
    return all(node in ready for node in cluster.nodes)


def _wait_cluster_ready(session: requests.Session, cluster: SlurmCluster) -> None:
    logs = cluster.conf.parent / "log"
    _wait_for(
        lambda: bool(_rest_get(session, cluster, "ping").get("pings")),
        f"slurmrestd of {cluster.name} to answer /ping at {cluster.rest_url}",
        [logs / "slurmrestd.log", logs / "slurmctld.log"],
        _START_TIMEOUT_S,
    )
    _wait_for(
        lambda: _nodes_idle(session, cluster),
        f"nodes {', '.join(cluster.nodes)} of {cluster.name} to be idle",
        [logs / "slurmctld.log", *(logs / f"slurmd-{n}.log" for n in cluster.nodes)],
        _START_TIMEOUT_S,
    )


def _toml_str(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(value)


def _grid_toml(grid: SlurmGrid, layouts: Sequence[ClusterLayout]) -> str:
    out = ["version = 1", "default_bandwidth_mbps = 100", ""]
    for layout, cluster in zip(layouts, grid.clusters, strict=True):
        out += [
            f"[sites.{cluster.name}]",
            'kind = "slurm"',
            f"processors = {cluster.cpus}",
            f"slowness = {layout.slowness!r}",
            f"url = {_toml_str(cluster.rest_url)}",
            f"partition = {_toml_str(PARTITION)}",
            'user = "root"',
            f"token = {{ env = {_toml_str(cluster.token_env)} }}",
            f"storage_dir = {_toml_str(str(cluster.storage_dir))}",
            "",
        ]
    origin = ", ".join(f"{lay.name} = {lay.origin_bandwidth_mbps!r}" for lay in layouts)
    out += ["[bandwidth]", f"origin = {{ {origin} }}", ""]
    return "\n".join(out)


def _write_outputs(grid: SlurmGrid, layouts: Sequence[ClusterLayout]) -> None:
    grid.grid_toml.write_text(_grid_toml(grid, layouts))
    env_file = grid.dir / ENV_FILE
    env_file.touch(mode=0o600)
    env_file.chmod(0o600)
    env_file.write_text("".join(f"export {k}={v}\n" for k, v in grid.env.items()))


def _launch(grid: SlurmGrid, layouts: Sequence[ClusterLayout]) -> None:
    munge_socket = _start_munge(grid.dir)
    all_ports = iter(_free_ports(sum(len(lay.node_cpus) + 2 for lay in layouts)))
    plans: list[tuple[ClusterLayout, Path, _Ports]] = []
    # Start every controller before waiting on any: their start-up delays overlap.
    for lay in layouts:
        ports = _Ports(
            ctld=next(all_ports),
            slurmd=tuple(next(all_ports) for _ in lay.node_cpus),
            rest=next(all_ports),
        )
        plans.append((lay, _start_controller_and_nodes(grid.dir, lay, munge_socket, ports), ports))
    clusters = []
    for lay, conf, ports in plans:
        token = _fetch_token(conf, lay.name)
        _start_rest(grid, conf, lay.name, ports.rest)
        cluster = SlurmCluster(
            name=lay.name,
            rest_url=f"http://127.0.0.1:{ports.rest}",
            token=token,
            token_env=f"GRIDCORE_SLURM_TOKEN_{lay.name.upper()}",
            conf=conf,
            cpus=sum(lay.node_cpus),
            nodes=lay.node_names,
            storage_dir=conf.parent / "storage",
            first_job_id=lay.first_job_id,
        )
        clusters.append(cluster)
        grid.env[cluster.token_env] = token
    grid.clusters = tuple(clusters)
    with requests.Session() as session:
        for cluster in grid.clusters:
            _wait_cluster_ready(session, cluster)
    _write_outputs(grid, layouts)


def start_grid(base_dir: Path, layouts: Sequence[ClusterLayout] = DEFAULT_LAYOUT) -> SlurmGrid:
    """Start the grid under ``base_dir`` and wait until every node is idle.

    On any failure, everything already started is stopped before the error propagates.
    """
    ensure_slurm_installed()
    base_dir = base_dir.resolve()
    # A previous run's daemons in this directory would hold its ports and PID files.
    stop_grid_dir(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    base_dir.chmod(0o755)
    _ensure_world_traversable(base_dir)
    (base_dir / MANIFEST).write_text("[]")
    grid = SlurmGrid(dir=base_dir, clusters=(), grid_toml=base_dir / TOML_FILE, env={})
    try:
        _launch(grid, layouts)
    except BaseException:
        stop_grid(grid)
        raise
    return grid


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurmgrid", description=__doc__)
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", type=Path, required=True, help="scratch directory of the grid")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            grid = start_grid(args.dir)
            print(grid.grid_toml)
            print(f"token variables: source {grid.dir / ENV_FILE}", file=sys.stderr)
        else:
            stop_grid_dir(args.dir.resolve())
    except SlurmGridError as exc:
        print(f"slurmgrid: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
