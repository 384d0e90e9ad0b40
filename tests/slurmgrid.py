"""Start and stop a real three-cluster Slurm grid on localhost for the test suite.

How it works, in full: ``docs/slurm-test-grid.md``
(section ``tests/slurmgrid.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from gridcore.errors import GridError
from tests import slurm_releases
from tests.slurm_releases import CHROOT_PATH, HOST_RELEASE, ChrootError, Mount, Release

APT_PACKAGES = slurm_releases.SLURM_PACKAGES  # the host's, the same as every chroot's
# The REST version of the host's Slurm 22.05; a cluster's own is SlurmCluster.api_version.
API_VERSION = "v0.0.38"
MANIFEST = "daemons.json"
# Every mount the grid made into a chroot, recorded before it is made (like MANIFEST).
MOUNTS_FILE = "mounts.json"
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
NETWORK_ENV = "GRIDCORE_SLURM_NETWORK"
NETWORKS = ("netns", "loopback", "auto")
NETNS_FILE = "netns.json"
NETNS_PREFIX = "gcsg-"
# Accounting: the MariaDB server (host:port) and what the grid makes there.
MYSQL_ENV = "GRIDCORE_SLURM_MYSQL"
DEFAULT_MYSQL = "127.0.0.1:3306"
DB_PREFIX = "gridcore_slurm_"
_DB_NAME = re.compile(r"gridcore_slurm_[0-9a-f]{8}_[a-z0-9]{1,20}")
ACCOUNTING_FILE = "accounting.json"
_DB_RECORD_PREFIX = "db-"
# Owner records of every namespace any grid on this host made (stale-leftover cleanup).
NETNS_RUN_DIR = Path("/run/gridcore-slurmgrid")
# Each cluster gets 10.213.X.0/24 (X = 1..254, the first not in use on this host).
SUBNET_BASE = "10.213"
LOOPBACK = "127.0.0.1"
_FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
    | {"DEADLINE", "PREEMPTED"}
)


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
    # None: the fast default; N: jobs start only on N-second scheduler ticks.
    sched_interval_s: int | None = None
    # The Slurm release it runs (tests.slurm_releases.RELEASES): the host's own, or a
    # newer one from a Debian chroot.
    release: str = HOST_RELEASE
    # Slurm accounting: a slurmdbd of its release with a MariaDB database of its own.
    accounting: bool = False
    # How long slurmctld keeps a finished job (its MinJobAge); see set_min_job_age.
    min_job_age_s: int = 300

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-n{i + 1}" for i in range(len(self.node_cpus)))


DEFAULT_LAYOUT = (
    ClusterLayout("alpha", (16,), 1000, 200.0, release="26.05", accounting=True),
    ClusterLayout("beta", (8, 8), 2000, 100.0, release="22.05"),
    ClusterLayout("gamma", (4,), 3000, 50.0, release="24.11"),
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
    # Where its daemons listen (the namespace side of its veth, or 127.0.0.1).
    address: str = LOOPBACK
    # Where its jobs reach the host (the host side of its veth, or 127.0.0.1): bind a
    # server the jobs must reach to this address (or 0.0.0.0) and hand them this address.
    host_address: str = LOOPBACK
    # Its network namespace (None in the loopback layout).
    netns: str | None = None
    # The Slurm release it runs ("22.05", "24.11", "26.05") and the newest REST version
    # its slurmrestd serves (from GET /openapi/v3), e.g. "v0.0.45".
    release: str = HOST_RELEASE
    api_version: str = API_VERSION
    # The Debian chroot its daemons, tools and jobs run in (None: the host's Slurm).
    chroot: Path | None = None
    # Slurm accounting: a slurmdbd keeps its jobs after slurmctld forgets them
    # (MinJobAge), with what they used (jobacct_gather/linux, every second); its
    # slurmrestd serves slurmdbd's API too (/slurmdb/<api_version>/..., listed by
    # GET /openapi/v3), and sacct/sacctmgr work through cluster.cli.
    accounting: bool = False

    def cli_argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """``argv`` (a Slurm tool by name, e.g. ``["squeue", "-h"]``, and its arguments) as
        a command line that runs THIS cluster's release of the tool against it, from the
        host, with ``SLURM_CONF`` and a PATH set (plus ``env``); nothing else inherited."""
        return _cli_argv(self.conf, self.chroot, argv, env)

    def cli(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        check: bool = False,
        timeout: float = 30,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm tool of the cluster's own release (see ``cli_argv``); text output
        captured. ``check=True`` raises SlurmGridError with its stderr if it fails."""
        done = subprocess.run(
            self.cli_argv(argv, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmGridError(
                f"`{' '.join(argv)}` on {self.name} (Slurm {self.release}) failed with "
                f"{done.returncode}: {done.stderr.strip() or done.stdout.strip()}"
            )
        return done

    def rest(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """A raw REST call as root: ``/slurm/<api_version>/<path>`` (e.g. "jobs",
        "job/1000", "job/submit"); ``kwargs`` go to ``requests.request``."""
        headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": self.token}
        kwargs.setdefault("timeout", 15)
        url = f"{self.rest_url}/slurm/{self.api_version}/{path.lstrip('/')}"
        return requests.request(method, url, headers=headers, **kwargs)

    def sbatch(
        self,
        command: str,
        *,
        cwd: Path,
        name: str = "grid-test",
        output: Path | None = None,
        options: Sequence[str] = (),
    ) -> str:
        """Submit ``command`` (a shell line) with the cluster's own ``sbatch``; its job
        id. The job runs in ``cwd`` (a path the same on the host and in a chroot, e.g.
        under /tmp) and writes to ``output`` (default ``cwd/slurm-%j.out``)."""
        argv = ["sbatch", "--parsable", f"--job-name={name}", f"--chdir={cwd}"]
        if output is not None:
            argv.append(f"--output={output}")
        done = self.cli([*argv, *options, "--wrap", command], check=True)
        return done.stdout.strip().split(";", 1)[0]

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, ExitCode, NodeList, ...); {} if
        the controller does not know the job."""
        done = self.cli(["scontrol", "show", "job", "-o", str(job_id)])
        if done.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout))

    def wait_job(self, job_id: str, timeout_s: float = 60.0) -> dict[str, str]:
        """``show_job`` once the job has ended (any final state); SlurmGridError after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.show_job(job_id)
            if job.get("JobState") in _FINAL_STATES:
                return job
            if time.monotonic() > deadline:
                raise SlurmGridError(f"job {job_id} of {self.name} still {job} after {timeout_s} s")
            time.sleep(0.2)

    def cli_env(self) -> dict[str, str]:
        """Environment for the HOST's Slurm tools aimed at this cluster; only for a cluster
        of the host's release (the tools of another release cannot talk to it): use
        ``cli``/``cli_argv``, which work for every cluster."""
        if self.chroot is not None:
            raise SlurmGridError(
                f"{self.name} runs Slurm {self.release} in {self.chroot}: the host's tools "
                "cannot talk to it; use cluster.cli(argv) or cluster.cli_argv(argv)"
            )
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": _SEARCH_PATH}

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run where the cluster's jobs run: inside its network
        namespace and, for a newer release, its chroot (environment inherited)."""
        if self.chroot is not None:
            argv = [_chroot_bin(), str(self.chroot), *argv]
        return _in_netns(self.netns, argv)


@dataclass
class SlurmGrid:
    """A running grid. ``env`` maps the TOML's token env var names to the tokens."""

    dir: Path
    clusters: tuple[SlurmCluster, ...]
    grid_toml: Path
    env: dict[str, str] = field(repr=False)
    # slurmrestd runs in the foreground as our child; kept to reap it on stop.
    children: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    # "netns" or "loopback": the layout actually started.
    network: str = "loopback"

    def by_release(self, release: str) -> SlurmCluster:
        """The (first) cluster that runs Slurm ``release``, e.g. "24.11"."""
        for cluster in self.clusters:
            if cluster.release == release:
                return cluster
        raise SlurmGridError(f"no cluster of Slurm {release} in grid {self.dir}")

    def cluster(self, key: str | int) -> SlurmCluster:
        """A cluster by name, or by its position in the layout (0, 1, 2)."""
        if isinstance(key, int):
            if 0 <= key < len(self.clusters):
                return self.clusters[key]
        else:
            for cluster in self.clusters:
                if cluster.name == key:
                    return cluster
        raise SlurmGridError(f"no cluster {key!r} in grid {self.dir}")


@dataclass(frozen=True)
class _Ports:
    ctld: int
    slurmd: tuple[int, ...]
    rest: int
    # Its slurmdbd's (None: no accounting).
    dbd: int | None = None


@dataclass(frozen=True)
class _Net:
    """One cluster's namespace and veth pair; ``subnet`` is X of 10.213.X.0/24."""

    netns: str | None
    host_if: str | None
    subnet: int | None

    @property
    def address(self) -> str:
        return LOOPBACK if self.subnet is None else f"{SUBNET_BASE}.{self.subnet}.2"

    @property
    def host_address(self) -> str:
        return LOOPBACK if self.subnet is None else f"{SUBNET_BASE}.{self.subnet}.1"


_LOOPBACK_NET = _Net(None, None, None)


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


# --------------------------------------------------------------------------- releases


def _chroot_bin() -> str:
    found = shutil.which("chroot", path=_SEARCH_PATH)
    if found is None:
        raise SlurmGridError("`chroot` (coreutils) not found")
    return found


def _cli_argv(
    conf: Path, chroot: Path | None, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> list[str]:
    """A Slurm tool of the release at ``chroot`` (None: the host's) run against ``conf``'s
    cluster, with a clean environment: ``env -i PATH=... SLURM_CONF=... TOOL ARGS``."""
    variables = {
        "PATH": CHROOT_PATH if chroot is not None else _SEARCH_PATH,
        "SLURM_CONF": str(conf),
        **(env or {}),
    }
    prefix = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in variables.items())]
    if chroot is None:
        return [*prefix, *argv]
    return [_chroot_bin(), str(chroot), *prefix, *argv]


def _daemon_argv(
    netns: str | None,
    chroot: Path | None,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """A Slurm daemon (by name) of the release at ``chroot`` (None: the host's), in the
    cluster's namespace: ``nsenter --net=NS chroot DIR env -i ... DAEMON ARGS``. Every
    step execs the next, so the process started is the daemon itself."""
    if chroot is None:
        return _in_netns(netns, [_binary(argv[0]), *argv[1:]])
    conf = Path(argv[argv.index("-f") + 1])
    return _in_netns(netns, _cli_argv(conf, chroot, argv, env))


def _layout_release(layout: ClusterLayout) -> Release:
    try:
        return slurm_releases.release(layout.release)
    except ChrootError as exc:
        raise SlurmGridError(f"cluster {layout.name}: {exc}") from None


def _ensure_releases(layouts: Sequence[ClusterLayout]) -> dict[str, Path | None]:
    """release -> its chroot (None: the host's Slurm), each chroot built first if missing
    (or waited for while another process builds it)."""
    roots: dict[str, Path | None] = {}
    for layout in layouts:
        rel = _layout_release(layout)
        if rel.version in roots:
            continue
        if not rel.in_chroot:
            ensure_slurm_installed()
            roots[rel.version] = None
            continue
        try:
            roots[rel.version] = slurm_releases.ensure_chroot(rel)
        except (ChrootError, OSError, subprocess.SubprocessError) as exc:
            raise SlurmGridError(f"no chroot for Slurm {rel.version}: {exc}") from exc
    return roots


def _release_of(output: str) -> str | None:
    """ "22.05" from ``scontrol --version`` output such as "slurm-wlm 22.05.8"."""
    found = re.search(r"\b(\d+\.\d+)\.\d+", output)
    return found.group(1) if found else None


def _check_release(conf: Path, chroot: Path | None, layout: ClusterLayout) -> None:
    done = subprocess.run(
        _cli_argv(conf, chroot, ["scontrol", "--version"]),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    found = _release_of(done.stdout)
    if found != layout.release:
        raise SlurmGridError(
            f"cluster {layout.name} should run Slurm {layout.release}, but its scontrol "
            f"says {done.stdout.strip() or done.stderr.strip()!r}"
        )


# --------------------------------------------------------------------------- mounts


def _job_paths() -> tuple[list[Path], list[Path]]:
    """Host directories a chroot's daemons and jobs need at the same path: read-write the
    temp dirs (the grid's scratch dir, tests' tmp_path, state dirs), read-only the
    repository (gridcore, installed editable), the venv and the base interpreter."""
    shared = [Path("/tmp"), Path(tempfile.gettempdir())]
    repos = {Path(__file__).resolve().parents[1]}
    with contextlib.suppress(ImportError):
        import gridcore

        repos.add(Path(gridcore.__file__).resolve().parents[1])
    read_only = [*sorted(repos), Path(sys.prefix), Path(sys.base_prefix)]
    return shared, read_only


def _record_mount(base_dir: Path, spec: Mount, created: Sequence[str]) -> None:
    entries = _read_mounts(base_dir)
    entries.append({**spec.as_record(), "created": list(created)})
    (base_dir / MOUNTS_FILE).write_text(json.dumps(entries, indent=1))


def _read_mounts(base_dir: Path) -> list[dict[str, Any]]:
    try:
        loaded: list[dict[str, Any]] = json.loads((base_dir / MOUNTS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return loaded


def _mount_chroot(base_dir: Path, root: Path) -> None:
    """proc, sys, dev, the temp dirs (with the grid's own scratch dir), the repository,
    the venv and the interpreter into ``root``, each recorded in MOUNTS_FILE before it
    is made (so stop, even of a killed run's grid, unmounts it)."""
    shared, read_only = _job_paths()
    real_root = root.resolve()
    for path in (*shared, base_dir):
        if path.resolve() in (real_root, *real_root.parents):
            raise SlurmGridError(
                f"the chroot {root} is inside {path}, which is bound into it: keep "
                f"${slurm_releases.CACHE_ENV} out of the temp dirs and the grid's dir"
            )
    specs = slurm_releases.system_mounts(root)
    specs += slurm_releases.bind_mounts(root, [*shared, base_dir], read_only)
    for spec in specs:
        target = Path(spec.target)
        created = slurm_releases.missing_dirs(target)
        _record_mount(base_dir, spec, created)
        target.mkdir(parents=True, exist_ok=True)
        # A symlink inside the chroot must never lead a mount out of it.
        if real_root not in target.resolve().parents:
            raise SlurmGridError(f"mount point {target} leaves the chroot {root}")
        try:
            slurm_releases.do_mount(spec)
        except ChrootError as exc:
            raise SlurmGridError(str(exc)) from exc


def _unmount_all(base_dir: Path) -> None:
    """Undo every recorded mount (latest first) and remove the mount points it made."""
    entries = _read_mounts(base_dir)
    for entry in reversed(entries):
        slurm_releases.undo_mount(entry["target"], entry.get("kind") == "rbind")
        for directory in reversed(entry.get("created", [])):
            with contextlib.suppress(OSError):  # not empty, or another grid mounts there
                Path(directory).rmdir()
    (base_dir / MOUNTS_FILE).unlink(missing_ok=True)


# --------------------------------------------------------------------------- manifest


def _record_daemon(
    base_dir: Path,
    pid_file: Path,
    program: str,
    conf: Path | None = None,
    chroot: Path | None = None,
) -> None:
    """Append a daemon to the manifest before it starts (so stop can find it)."""
    entries = _read_manifest(base_dir)
    entry = {"pid_file": str(pid_file), "program": program}
    if conf is not None:
        entry["conf"] = str(conf)
    if chroot is not None:
        entry["chroot"] = str(chroot)
    entries.append(entry)
    (base_dir / MANIFEST).write_text(json.dumps(entries, indent=1))


def _read_manifest(base_dir: Path) -> list[dict[str, str]]:
    manifest = base_dir / MANIFEST
    if not manifest.exists():
        return []
    loaded: list[dict[str, str]] = json.loads(manifest.read_text())
    return loaded


# --------------------------------------------------------------------------- network


def _in_netns(netns: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run in the network namespace ``netns`` (and nothing else changed).

    Not ``ip netns exec``: it also enters a new mount namespace with /sys remounted for
    the netns, which hides /sys/fs/cgroup, and slurmd 22.05 then refuses to start ("No
    filesystem mounted on /sys/fs/cgroup"). nsenter joins only the network namespace and
    execs the command itself (no fork), so a Popen's pid is the daemon's.
    """
    if not netns:
        return list(argv)
    return [_nsenter(), f"--net=/run/netns/{netns}", "--", *argv]


def _nsenter() -> str:
    found = shutil.which("nsenter", path=_SEARCH_PATH)
    if found is None:
        raise SlurmGridError("`nsenter` (util-linux) not found: apt-get install -y util-linux")
    return found


def _ip() -> str:
    found = shutil.which("ip", path=_SEARCH_PATH)
    if found is None:
        raise SlurmGridError("`ip` (iproute2) not found: apt-get install -y iproute2")
    return found


def _ip_run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([_ip(), *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise SlurmGridError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def netns_unavailable_reason() -> str | None:
    """Why the namespaced layout cannot be used here, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip", path=_SEARCH_PATH) is None:
        return "`ip` (iproute2) is not installed"
    if shutil.which("nsenter", path=_SEARCH_PATH) is None:
        return "`nsenter` (util-linux) is not installed"
    done = subprocess.run(
        [_ip(), "netns", "list"], capture_output=True, text=True, timeout=20, check=False
    )
    if done.returncode != 0:
        return f"`ip netns list` failed: {done.stderr.strip()}"
    return None


def _proc_start_time(pid: int) -> str | None:
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime); fields after the command name's ')' start at field 3.
    return stat_text.rsplit(")", 1)[1].split()[19]


@contextlib.contextmanager
def _netns_lock() -> Iterator[None]:
    """Serialises subnet choice, namespace creation and stale cleanup between runs."""
    NETNS_RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    with (NETNS_RUN_DIR / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _netns_names() -> list[str]:
    out = _ip_run("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _record_path(netns: str) -> Path:
    return NETNS_RUN_DIR / f"{netns}.json"


def _owner_alive(record: dict[str, Any]) -> bool:
    pid = record.get("owner_pid")
    if pid is None:  # started from the command line: lives until `stop`
        return True
    return _alive(int(pid)) and _proc_start_time(int(pid)) == record.get("owner_start")


def _remove_netns(netns: str, host_if: str | None) -> None:
    """Kill what still runs in ``netns`` (our own daemons' or jobs' leftovers, by PID),
    delete it and its veth pair, and drop its owner record."""
    if netns in _netns_names():
        done = _ip_run("netns", "pids", netns, check=False)
        pids = [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]
        _signal_all(pids, signal.SIGTERM)
        _signal_all(_wait_gone(pids, _STOP_TIMEOUT_S), signal.SIGKILL)
        _wait_gone(pids, _STOP_TIMEOUT_S)
        _ip_run("netns", "delete", netns, check=False)
    # Deleting the namespace destroys its veth end and so the pair; make sure.
    if host_if and _ip_run("link", "show", host_if, check=False).returncode == 0:
        _ip_run("link", "delete", host_if, check=False)
    _record_path(netns).unlink(missing_ok=True)


def cleanup_stale_netns() -> list[str]:
    """Remove grid namespaces whose owner process is gone (a killed run), with that
    run's daemons; returns their names. A namespace of a live run (or of a grid started
    from the command line) is kept."""
    stale: list[tuple[str, dict[str, Any]]] = []
    # Decided under the lock: a record is written before its namespace is made, so a
    # namespace being made by another run is never taken for a stray one.
    with _netns_lock():
        names = set(_netns_names())
        records = {p.stem: p for p in NETNS_RUN_DIR.glob(f"{NETNS_PREFIX}*.json")}
        for netns in sorted(names | set(records)):
            if not netns.startswith(NETNS_PREFIX):
                continue
            try:
                record: dict[str, Any] = json.loads(records[netns].read_text())
            except (KeyError, OSError, ValueError):
                record = {}
            if not (record and _owner_alive(record)):
                stale.append((netns, record))
    # Stopping takes seconds; once stale, a namespace stays stale, so no lock is needed.
    for netns, record in stale:
        grid_dir = record.get("dir")
        if grid_dir and Path(grid_dir, MANIFEST).exists():
            stop_grid_dir(Path(grid_dir), remove_netns=False)
        _remove_netns(netns, record.get("host_if"))
    return [netns for netns, _ in stale]


def _used_subnets() -> set[int]:
    """X of every 10.213.X.0/24 this host already uses (addresses, routes, records)."""
    used: set[int] = set()
    text = _ip_run("-4", "-o", "addr", "show").stdout + _ip_run("-4", "route", "show").stdout
    for record in NETNS_RUN_DIR.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            subnet = json.loads(record.read_text()).get("subnet")
            if subnet is not None:
                used.add(int(subnet))
    for word in text.split():
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(word, strict=False)
            for x in range(1, 255):
                if net.overlaps(ipaddress.ip_network(f"{SUBNET_BASE}.{x}.0/24")):
                    used.add(x)
    return used


def _make_networks(base_dir: Path, names: Sequence[str], persistent: bool) -> list[_Net]:
    """One namespace + veth pair per cluster, recorded (owner record and the grid's
    ``netns.json``) before it is made, so every exit path can remove it."""
    tag = secrets.token_hex(3)
    nets: list[_Net] = []
    with _netns_lock():
        free = [x for x in range(1, 255) if x not in _used_subnets()]
        if len(free) < len(names):
            raise SlurmGridError(f"no free {SUBNET_BASE}.X.0/24 subnets left for the grid")
        owner: dict[str, Any] = {"owner_pid": None, "owner_start": None}
        if not persistent:
            owner = {"owner_pid": os.getpid(), "owner_start": _proc_start_time(os.getpid())}
        for index, (name, subnet) in enumerate(zip(names, free, strict=False)):
            # Interface names: 15 characters at most.
            net = _Net(f"{NETNS_PREFIX}{tag}-{name}", f"gs{tag}h{index}", subnet)
            nets.append(net)
            record = {**owner, "dir": str(base_dir), "host_if": net.host_if, "subnet": subnet}
            _record_path(str(net.netns)).write_text(json.dumps(record))
            (base_dir / NETNS_FILE).write_text(
                json.dumps([{"netns": n.netns, "host_if": n.host_if} for n in nets])
            )
            _create_network(net, f"gs{tag}n{index}")
    for net in nets:  # every namespace reaches the others through the host
        for other in nets:
            if other is not net:
                _ip_run(
                    "-n", str(net.netns), "route", "add",
                    f"{SUBNET_BASE}.{other.subnet}.0/24", "via", net.host_address,
                )  # fmt: skip
    return nets


def _create_network(net: _Net, ns_if: str) -> None:
    netns, host_if = str(net.netns), str(net.host_if)
    _ip_run("netns", "add", netns)
    _ip_run("-n", netns, "link", "set", "lo", "up")
    _ip_run("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", netns)
    _ip_run("addr", "add", f"{net.host_address}/24", "dev", host_if)
    _ip_run("link", "set", host_if, "up")
    _ip_run("-n", netns, "addr", "add", f"{net.address}/24", "dev", ns_if)
    _ip_run("-n", netns, "link", "set", ns_if, "up")
    # Forward only what arrives on this grid's own veths (the global switch stays off):
    # that is how one cluster's jobs reach another cluster's namespace.
    Path(f"/proc/sys/net/ipv4/conf/{host_if}/forwarding").write_text("1\n")


def _remove_grid_networks(base_dir: Path) -> None:
    path = base_dir / NETNS_FILE
    try:
        entries: list[dict[str, str]] = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    for entry in entries:
        _remove_netns(entry["netns"], entry.get("host_if"))
    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- accounting


@dataclass(frozen=True)
class _Database:
    """A MariaDB database and user made for one cluster's slurmdbd (same name)."""

    name: str
    password: str = field(repr=False)


def _mysql_server() -> tuple[str, int]:
    text = os.environ.get(MYSQL_ENV) or DEFAULT_MYSQL
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SlurmGridError(f"${MYSQL_ENV} must be HOST:PORT, not {text!r}")
    return host, int(port)


def _mysql_client() -> str | None:
    return shutil.which("mariadb", path=_SEARCH_PATH) or shutil.which("mysql", path=_SEARCH_PATH)


def _mysql(sql: str) -> subprocess.CompletedProcess[str]:
    """``sql`` run as the server's root over TCP (the client reads root's password, if
    any, from ~/.my.cnf or $MYSQL_PWD); tab-separated rows, no header."""
    client = _mysql_client()
    if client is None:
        raise SlurmGridError("no MariaDB client: apt-get install -y mariadb-client")
    host, port = _mysql_server()
    argv = [client, "--protocol=TCP", "-h", host, "-P", str(port), "-u", "root"]
    argv += ["--batch", "--skip-column-names", "--connect-timeout=5", "-e", sql]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _mysql_checked(sql: str) -> str:
    done = _mysql(sql)
    if done.returncode != 0:
        raise SlurmGridError(f"MariaDB refused `{sql}`: {done.stderr.strip()}")
    return done.stdout


def accounting_unavailable_reason() -> str | None:
    """Why no cluster can have accounting here (no MariaDB client, server or root
    login), or None if it can."""
    if _mysql_client() is None:
        return "no MariaDB client (apt-get install -y mariadb-client)"
    try:
        done = _mysql("SELECT 1")
    except (OSError, subprocess.SubprocessError, SlurmGridError) as exc:
        return f"MariaDB at {os.environ.get(MYSQL_ENV) or DEFAULT_MYSQL}: {exc}"
    if done.returncode != 0:
        where = os.environ.get(MYSQL_ENV) or DEFAULT_MYSQL
        return f"MariaDB at {where} refused root: {done.stderr.strip()}"
    return None


def _db_record_path(name: str) -> Path:
    return NETNS_RUN_DIR / f"{_DB_RECORD_PREFIX}{name}.json"


def _read_accounting(base_dir: Path) -> list[str]:
    try:
        names: list[str] = json.loads((base_dir / ACCOUNTING_FILE).read_text())
    except (OSError, ValueError):
        return []
    return names


def _create_database(base_dir: Path, cluster: str, tag: str, persistent: bool) -> _Database:
    """A fresh database and user of that name for ``cluster``'s slurmdbd, recorded (the
    grid's ``accounting.json`` and an owner record) before it is made."""
    db = _Database(f"{DB_PREFIX}{tag}_{cluster.lower()}", secrets.token_hex(16))
    if not _DB_NAME.fullmatch(db.name):
        raise SlurmGridError(f"cluster name {cluster!r} does not make a database name")
    owner: dict[str, Any] = {"owner_pid": None, "owner_start": None}
    if not persistent:
        owner = {"owner_pid": os.getpid(), "owner_start": _proc_start_time(os.getpid())}
    with _netns_lock():
        _db_record_path(db.name).write_text(json.dumps({**owner, "dir": str(base_dir)}))
        names = _read_accounting(base_dir)
        (base_dir / ACCOUNTING_FILE).write_text(json.dumps([*names, db.name]))
        _mysql_checked(
            f"CREATE DATABASE `{db.name}`; "
            f"CREATE USER '{db.name}'@'%' IDENTIFIED BY '{db.password}'; "
            f"GRANT ALL PRIVILEGES ON `{db.name}`.* TO '{db.name}'@'%'"
        )
    return db


def _drop_database(name: str) -> bool:
    """Drop one of the grid's databases and its user; False if MariaDB refused."""
    if not _DB_NAME.fullmatch(name):  # never anything the grid did not make
        return False
    try:
        done = _mysql(f"DROP DATABASE IF EXISTS `{name}`; DROP USER IF EXISTS '{name}'@'%'")
    except (OSError, subprocess.SubprocessError, SlurmGridError):
        return False
    if done.returncode != 0:
        return False
    _db_record_path(name).unlink(missing_ok=True)
    return True


def _drop_grid_databases(base_dir: Path) -> None:
    """Drop the databases the grid in ``base_dir`` made (after its slurmdbd stopped); a
    database MariaDB would not drop stays recorded for the next start to retry."""
    names = _read_accounting(base_dir)
    left = [name for name in names if not _drop_database(name)]
    if left:
        (base_dir / ACCOUNTING_FILE).write_text(json.dumps(left))
    else:
        (base_dir / ACCOUNTING_FILE).unlink(missing_ok=True)


def cleanup_stale_databases() -> list[str]:
    """Drop the grid databases (and users) whose owner process is gone (a killed run),
    after stopping that grid's daemons, and any ``gridcore_slurm_*`` database or user no
    record owns; returns the databases dropped. Others are never touched."""
    if accounting_unavailable_reason() is not None:
        return []
    stale: dict[str, dict[str, Any]] = {}
    with _netns_lock():
        records = {
            p.name[len(_DB_RECORD_PREFIX) : -len(".json")]: p
            for p in NETNS_RUN_DIR.glob(f"{_DB_RECORD_PREFIX}{DB_PREFIX}*.json")
        }
        like = DB_PREFIX.replace("_", "\\_") + "%"
        found = set(_mysql_checked(f"SHOW DATABASES LIKE '{like}'").split())
        found |= set(
            _mysql_checked(f"SELECT User FROM mysql.user WHERE User LIKE '{like}'").split()
        )
        for name in sorted(found | set(records)):
            if not _DB_NAME.fullmatch(name):
                continue
            try:
                record: dict[str, Any] = json.loads(records[name].read_text())
            except (KeyError, OSError, ValueError):
                record = {}
            # No record: made by no live run (each is recorded before it is made).
            if not (record and _owner_alive(record)):
                stale[name] = record
    for name, record in stale.items():
        grid_dir = record.get("dir")
        if grid_dir and Path(grid_dir, MANIFEST).exists():
            stop_grid_dir(Path(grid_dir))  # its slurmdbd first; drops its databases
        _drop_database(name)
    return sorted(stale)


def _accounting_lines(net: _Net, dbd_port: int, munge_socket: Path) -> list[str]:
    """slurm.conf of a cluster with accounting: its slurmdbd on the host, the jobs'
    comments (gridcore's submission keys) stored, usage sampled every second."""
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={net.host_address}",
        f"AccountingStoragePort={dbd_port}",
        # What authenticates every connection to slurmdbd (AuthInfo does not): the munge
        # socket, like AuthInfo's.
        f"AccountingStoragePass=socket={munge_socket}",
        "AccountingStoreFlags=job_comment",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=1",
    ]


def _slurmdbd_conf(cdir: Path, munge_socket: Path, port: int, db: _Database) -> str:
    host, db_port = _mysql_server()
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={munge_socket}",
        # slurmrestd passes on its clients' tokens to slurmdbd too.
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={cdir / 'jwt.key'}",
        "DbdHost=localhost",
        f"DbdPort={port}",
        "SlurmUser=root",
        f"PidFile={cdir / 'slurmdbd.pid'}",
        f"LogFile={cdir / 'log' / 'slurmdbd.log'}",
        "StorageType=accounting_storage/mysql",
        f"StorageHost={host}",
        f"StoragePort={db_port}",
        f"StorageUser={db.name}",
        f"StoragePass={db.password}",
        f"StorageLoc={db.name}",
    ]
    return "\n".join(lines) + "\n"


def _start_slurmdbd(
    base_dir: Path, conf: Path, munge_socket: Path, port: int, db: _Database, chroot: Path | None
) -> None:
    """slurmdbd of the cluster's release (its chroot, or the host's), in the HOST's
    network namespace; it reads slurmdbd.conf beside ``conf`` (SLURM_CONF's directory)."""
    cdir = conf.parent
    dbd_conf = cdir / "slurmdbd.conf"
    dbd_conf.touch(mode=0o600)
    dbd_conf.chmod(0o600)  # slurmdbd refuses one others can read (it holds a password)
    dbd_conf.write_text(_slurmdbd_conf(cdir, munge_socket, port, db))
    _record_daemon(base_dir, cdir / "slurmdbd.pid", "slurmdbd")
    _run_daemon(
        _cli_argv(conf, chroot, ["slurmdbd"]),
        cdir / "log" / "launch-slurmdbd.log",
        f"slurmdbd of {cdir.name}",
        dict(os.environ),
    )


def _register_cluster(conf: Path, chroot: Path | None, name: str, net: _Net, port: int) -> None:
    """Once its slurmdbd listens (it creates its tables first), add the cluster to it
    with the release's own sacctmgr, as slurmctld wants it before it starts."""
    logs = [conf.parent / "log" / "slurmdbd.log"]

    def listening() -> bool:
        with contextlib.suppress(OSError):
            socket.create_connection((net.host_address, port), timeout=1).close()
            return True
        return False

    _wait_for(listening, f"slurmdbd of {name} on port {port}", logs, _START_TIMEOUT_S)
    argv = _cli_argv(conf, chroot, ["sacctmgr", "-i", "add", "cluster", name])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise SlurmGridError(
            f"`sacctmgr add cluster {name}` failed: {done.stderr.strip() or done.stdout.strip()}"
            f"\n{_tail(logs[0])}"
        )


def set_min_job_age(cluster: SlurmCluster, seconds: int) -> int:
    """Make the cluster's slurmctld forget finished jobs after ``seconds`` (its
    MinJobAge; ``scontrol reconfigure``, which 26.05 does by restarting slurmctld with
    its jobs); returns the previous value. Below 60 s slurmctld also purges that often
    (every max(10, MinJobAge) s), so a job is gone within about 2 x ``seconds``."""
    old = cluster.conf.read_text().splitlines()
    previous = next(int(line.split("=", 1)[1]) for line in old if line.startswith("MinJobAge="))
    lines = [f"MinJobAge={seconds}" if line.startswith("MinJobAge=") else line for line in old]
    cluster.conf.write_text("\n".join(lines) + "\n")
    _scontrol(cluster, "reconfigure")
    return previous


def _choose_network(network: str | None) -> str:
    """The layout to start for ``network`` (None: ``$GRIDCORE_SLURM_NETWORK``, else
    "loopback")."""
    wanted = network or os.environ.get(NETWORK_ENV) or "loopback"
    if wanted not in NETWORKS:
        raise SlurmGridError(f"network must be one of {NETWORKS}, not {wanted!r}")
    if wanted == "loopback":
        return wanted
    reason = netns_unavailable_reason()
    if reason is None:
        return "netns"
    if wanted == "netns":
        raise SlurmGridError(f"cannot run the Slurm clusters in network namespaces: {reason}")
    warnings.warn(
        f"Slurm test grid: {reason}; falling back to the loopback layout (every cluster on "
        "127.0.0.1 of the host, jobs not isolated per cluster)",
        stacklevel=3,
    )
    return "loopback"


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


def _squeue_ids(conf: Path, chroot: Path | None) -> list[str]:
    argv = _cli_argv(conf, chroot, ["squeue", "--noheader", "--format=%i"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    return done.stdout.split() if done.returncode == 0 else []


def _cancel_all_jobs(entries: Sequence[dict[str, str]]) -> None:
    """Cancel every live job: a job's slurmstepd outlives slurmd and slurmctld."""
    ctlds = [
        (Path(e["conf"]), Path(e["chroot"]) if e.get("chroot") else None)
        for e in entries
        if "conf" in e and _pid_of(Path(e["pid_file"]), e["program"]) is not None
    ]
    for conf, chroot in ctlds:
        ids = _squeue_ids(conf, chroot)
        if ids:
            argv = _cli_argv(conf, chroot, ["scancel", *ids])
            subprocess.run(argv, capture_output=True, timeout=20, check=False)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while ctlds and time.monotonic() < deadline:
        ctlds = [(conf, chroot) for conf, chroot in ctlds if _squeue_ids(conf, chroot)]
        time.sleep(0.1)


def stop_grid_dir(base_dir: Path, *, remove_netns: bool = True) -> None:
    """Stop every daemon listed in ``base_dir``'s manifest, by PID file, drop the
    databases it made for slurmdbd, undo the mounts it made into chroots, then remove the
    grid's network namespaces. Idempotent."""
    entries = _read_manifest(base_dir)
    _cancel_all_jobs(entries)
    # Slurm daemons first (reverse start order), then slurmdbd (slurmctld sends it what
    # it still holds as it stops), munged last: they talk through it.
    munge = [e for e in entries if e["program"] == "munged"]
    dbd = [e for e in entries if e["program"] == "slurmdbd"]
    slurm = [e for e in reversed(entries) if e["program"] not in ("munged", "slurmdbd")]
    for group in (slurm, dbd, munge):
        found = [(_pid_of(Path(e["pid_file"]), e["program"]), e) for e in group]
        pids = [pid for pid, _ in found if pid is not None]
        _signal_all(pids, signal.SIGTERM)
        stuck = _wait_gone(pids, _STOP_TIMEOUT_S)
        _signal_all(stuck, signal.SIGKILL)
        _wait_gone(stuck, _STOP_TIMEOUT_S)
        for _, entry in found:
            Path(entry["pid_file"]).unlink(missing_ok=True)
    _drop_grid_databases(base_dir)
    _unmount_all(base_dir)
    if remove_netns:
        _remove_grid_networks(base_dir)


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


def _scheduler_lines(interval_s: int | None) -> list[str]:
    """The fast default, or jobs started only on ``interval_s``-second ticks: with the
    builtin scheduler and ``defer``, neither a submission nor a job's end triggers a
    pass; ``batch_sched_delay=N`` keeps a submission from forcing one within 3 s."""
    if interval_s is None:
        return ["SchedulerType=sched/backfill"]
    if interval_s < 1:
        raise SlurmGridError(f"scheduler interval must be >= 1 s or None, not {interval_s}")
    return [
        "SchedulerType=sched/builtin",
        f"SchedulerParameters=defer,sched_interval={interval_s},batch_sched_delay={interval_s}",
    ]


def _slurm_conf(
    layout: ClusterLayout, cdir: Path, munge_socket: Path, ports: _Ports, net: _Net
) -> str:
    accounting = ["AccountingStorageType=accounting_storage/none"]
    accounting += ["JobAcctGatherType=jobacct_gather/none"]
    if ports.dbd is not None:
        accounting = _accounting_lines(net, ports.dbd, munge_socket)
    # In a namespace the controller's address is the namespace side of the veth, so the
    # CLI tools on the host (and slurmrestd, slurmd, jobs in the namespace) all reach it.
    ctld_host = "localhost" if net.netns is None else f"localhost({net.address})"
    lines = [
        f"ClusterName={layout.name}",
        f"SlurmctldHost={ctld_host}",
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
        *_scheduler_lines(layout.sched_interval_s),
        *accounting,
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        f"FirstJobId={layout.first_job_id}",
        # Keeps finished jobs visible to the REST API for 5 minutes (by default).
        f"MinJobAge={layout.min_job_age_s}",
        # Lets a node claim more CPUs than this machine has.
        "SlurmdParameters=config_overrides",
    ]
    for node, cpus, port in zip(layout.node_names, layout.node_cpus, ports.slurmd, strict=True):
        lines.append(
            f"NodeName={node} NodeAddr={net.address} NodeHostname=localhost Port={port} "
            f"CPUs={cpus} RealMemory=4000 State=UNKNOWN"
        )
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _write_cluster_dir(
    base_dir: Path,
    layout: ClusterLayout,
    munge_socket: Path,
    ports: _Ports,
    net: _Net,
    chroot: Path | None,
) -> Path:
    """The cluster's directory, JWT key and slurm.conf (checked against its release)."""
    cdir = base_dir / layout.name
    for sub in ("state", "spool", "log", "storage"):
        (cdir / sub).mkdir(parents=True, exist_ok=True)
    jwt_key = cdir / "jwt.key"
    jwt_key.write_bytes(secrets.token_bytes(32))
    jwt_key.chmod(0o600)
    conf = cdir / "slurm.conf"
    conf.write_text(_slurm_conf(layout, cdir, munge_socket, ports, net))
    if chroot is not None:
        # slurmd >= 23.02 dies without a cgroup filesystem ("No filesystem mounted on
        # /sys/fs/cgroup") unless its cgroup plugin is off; read from beside slurm.conf.
        (cdir / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
    _check_release(conf, chroot, layout)
    return conf


def _start_controller_and_nodes(
    base_dir: Path, layout: ClusterLayout, conf: Path, net: _Net, chroot: Path | None
) -> None:
    cdir = conf.parent
    env = {**os.environ, "SLURM_CONF": str(conf)}
    _record_daemon(base_dir, cdir / "slurmctld.pid", "slurmctld", conf, chroot)
    _run_daemon(
        _daemon_argv(net.netns, chroot, ["slurmctld", "-f", str(conf), "-i"]),
        cdir / "log" / "launch-slurmctld.log",
        f"slurmctld of {layout.name}",
        env,
    )
    for node in layout.node_names:
        _record_daemon(base_dir, cdir / f"slurmd-{node}.pid", "slurmd")
        _run_daemon(
            _daemon_argv(net.netns, chroot, ["slurmd", "-f", str(conf), "-N", node]),
            cdir / "log" / f"launch-slurmd-{node}.log",
            f"slurmd {node} of {layout.name}",
            env,
        )


def _fetch_token(conf: Path, name: str, chroot: Path | None) -> str:
    """A 24 h JWT for root, retried while slurmctld is still coming up."""
    argv = _cli_argv(conf, chroot, ["scontrol", "token", "username=root", "lifespan=86400"])
    deadline = time.monotonic() + _START_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        out = done.stdout.strip()
        if done.returncode == 0 and out.startswith("SLURM_JWT="):
            return out.split("=", 1)[1]
        last = done.stderr.strip() or out
        time.sleep(0.2)
    log = conf.parent / "log" / "slurmctld.log"
    raise SlurmGridError(f"no JWT from slurmctld of {name}: {last}\n{_tail(log)}")


def _rest_options(chroot: Path | None, accounting: bool = False) -> list[str]:
    """slurmrestd's user and plugins: 22.05 serves v0.0.36-38 and refuses to run as root;
    newer releases load the slurmctld plugin and, with accounting, the slurmdbd one (it
    refuses to load without slurmdbd), and from 25.11 on take the user only as a number."""
    if chroot is None:
        plugins = "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36"
        plugins += ",openapi/dbv0.0.38" if accounting else ""
        return ["-u", "nobody", "-g", "nogroup", "-a", "rest_auth/jwt", "-s", plugins]
    plugins = "openapi/slurmctld,openapi/slurmdbd" if accounting else "openapi/slurmctld"
    return ["-u", "65534", "-g", "65534", "-a", "rest_auth/jwt", "-s", plugins]


def _start_rest(
    grid: SlurmGrid, conf: Path, net: _Net, port: int, chroot: Path | None, accounting: bool
) -> None:
    cdir = conf.parent
    pid_file = cdir / "slurmrestd.pid"
    log = cdir / "log" / "slurmrestd.log"
    _record_daemon(grid.dir, pid_file, "slurmrestd")
    options = _rest_options(chroot, accounting)
    argv = ["slurmrestd", "-f", str(conf), *options, f"{net.address}:{port}"]
    # Without SLURM_JWT=daemon slurmrestd rejects every client token.
    jwt = {"SLURM_JWT": "daemon"}
    env = {**os.environ, "SLURM_CONF": str(conf), **jwt}
    with log.open("ab") as out:
        child = subprocess.Popen(
            _daemon_argv(net.netns, chroot, argv, jwt),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
        )
    grid.children.append(child)
    # slurmrestd stays in the foreground and writes no PID file; we write it for stop.
    pid_file.write_text(f"{child.pid}\n")


def _rest_get(session: requests.Session, cluster: SlurmCluster, path: str) -> dict[str, Any]:
    """GET ``/slurm/<the cluster's api_version>/<path>`` as root; {} on any failure."""
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token}
    url = f"{cluster.rest_url}/slurm/{cluster.api_version}/{path}"
    try:
        resp = session.get(url, headers=headers, timeout=5)
        body: dict[str, Any] = resp.json() if resp.status_code == 200 else {}
    except (requests.RequestException, ValueError):
        return {}
    return body


def served_api_versions(session: requests.Session, cluster: SlurmCluster) -> list[str]:
    """The REST versions (``v0.0.N``) the cluster's slurmrestd serves, oldest first, from
    its OpenAPI document (``GET /openapi/v3``); [] if it does not answer (yet)."""
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token}
    try:
        resp = session.get(f"{cluster.rest_url}/openapi/v3", headers=headers, timeout=5)
        paths = resp.json().get("paths", {}) if resp.status_code == 200 else {}
    except (requests.RequestException, ValueError, AttributeError):
        return []
    found = {m.group(1) for p in paths if (m := re.match(r"/slurm/(v\d+\.\d+\.\d+)/", p))}
    return sorted(found, key=lambda v: tuple(int(x) for x in v[1:].split(".")))


def _ping_up(ping: dict[str, Any]) -> bool:
    """A controller's ping entry says it answers: v0.0.38 ``ping == "UP"``, v0.0.40/41
    ``pinged == "UP"``, v0.0.42+ ``responding: true``."""
    if "responding" in ping:
        return ping["responding"] is True
    return (ping.get("pinged") or ping.get("ping")) == "UP"


def _controller_up(session: requests.Session, cluster: SlurmCluster) -> bool:
    pings = _rest_get(session, cluster, "ping").get("pings") or []
    return bool(pings) and all(_ping_up(p) for p in pings)


def node_states(node: dict[str, Any]) -> set[str]:
    """A node's state and flags as one upper-case set: v0.0.38 ``state: "idle"`` plus
    ``state_flags``; v0.0.40+ ``state: ["IDLE", "NOT_RESPONDING", ...]``."""
    state = node.get("state")
    states = set(state) if isinstance(state, list) else {str(state)}
    states |= set(node.get("state_flags") or [])
    return {s.upper() for s in states}


def _nodes_idle(session: requests.Session, cluster: SlurmCluster) -> bool:
    nodes = _rest_get(session, cluster, "nodes").get("nodes", [])
    # A node that just registered can read "idle" with flags such as NOT_RESPONDING.
    ready = {n.get("name") for n in nodes if node_states(n) == {"IDLE"}}
    return all(node in ready for node in cluster.nodes)


def _wait_cluster_ready(session: requests.Session, cluster: SlurmCluster) -> SlurmCluster:
    """Waits for slurmrestd, the controller and every node; returns the cluster with the
    newest REST version its slurmrestd serves."""
    logs = cluster.conf.parent / "log"
    served: list[str] = []

    def answers() -> bool:
        served[:] = served_api_versions(session, cluster)
        return bool(served)

    _wait_for(
        answers,
        f"slurmrestd of {cluster.name} to answer /openapi/v3 at {cluster.rest_url}",
        [logs / "slurmrestd.log", logs / "slurmctld.log"],
        _START_TIMEOUT_S,
    )
    cluster = dataclasses.replace(cluster, api_version=served[-1])
    _wait_for(
        lambda: _controller_up(session, cluster),
        f"slurmctld of {cluster.name} to answer /slurm/{cluster.api_version}/ping",
        [logs / "slurmrestd.log", logs / "slurmctld.log"],
        _START_TIMEOUT_S,
    )
    _wait_for(
        lambda: _nodes_idle(session, cluster),
        f"nodes {', '.join(cluster.nodes)} of {cluster.name} to be idle",
        [logs / "slurmctld.log", *(logs / f"slurmd-{n}.log" for n in cluster.nodes)],
        _START_TIMEOUT_S,
    )
    return cluster


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


@dataclass(frozen=True)
class _Plan:
    layout: ClusterLayout
    conf: Path
    ports: _Ports
    net: _Net
    chroot: Path | None


def _with_accounting(
    layouts: Sequence[ClusterLayout], roots: Mapping[str, Path | None]
) -> set[str]:
    """The clusters that get accounting: those that ask for it, if MariaDB is there and
    their release has slurmdbd (a chroot lacks it while a grid that started before it
    was asked for still uses it: the next start that finds the chroot unused adds it)."""
    wanted = {lay.name for lay in layouts if lay.accounting}
    reason = accounting_unavailable_reason() if wanted else None
    for lay in layouts:
        root = roots[lay.release]
        if lay.name not in wanted or reason is not None:
            continue
        if root is None and shutil.which("slurmdbd", path=_SEARCH_PATH) is None:
            reason = "slurmdbd is not installed (apt-get install -y slurmdbd)"
        elif root is not None and not _layout_release(lay).accounting:
            reason = f"the Slurm {lay.release} chroot is made without slurmdbd (its Release)"
        elif root is not None and not (root / "usr/sbin/slurmdbd").exists():
            reason = f"the Slurm {lay.release} chroot {root} has no slurmdbd yet"
    if reason is None:
        return wanted
    warnings.warn(
        f"Slurm test grid: {reason}; starting {', '.join(sorted(wanted))} without accounting",
        stacklevel=4,
    )
    return set()


def _launch(grid: SlurmGrid, layouts: Sequence[ClusterLayout], persistent: bool) -> None:
    roots = _ensure_releases(layouts)
    for root in sorted({r for r in roots.values() if r is not None}):
        _mount_chroot(grid.dir, root)
    munge_socket = _start_munge(grid.dir)
    nets = [_LOOPBACK_NET] * len(layouts)
    if grid.network == "netns":
        nets = _make_networks(grid.dir, [lay.name for lay in layouts], persistent)
    accounted = _with_accounting(layouts, roots)
    needed = sum(len(lay.node_cpus) + 2 + (lay.name in accounted) for lay in layouts)
    all_ports = iter(_free_ports(needed))
    tag = secrets.token_hex(4)
    plans: list[_Plan] = []
    for lay, net in zip(layouts, nets, strict=True):
        ports = _Ports(
            ctld=next(all_ports),
            slurmd=tuple(next(all_ports) for _ in lay.node_cpus),
            rest=next(all_ports),
            dbd=next(all_ports) if lay.name in accounted else None,
        )
        chroot = roots[lay.release]
        conf = _write_cluster_dir(grid.dir, lay, munge_socket, ports, net, chroot)
        plans.append(_Plan(lay, conf, ports, net, chroot))
    # slurmdbd first: it makes its tables while the other controllers start.
    for plan in plans:
        if plan.ports.dbd is not None:
            db = _create_database(grid.dir, plan.layout.name, tag, persistent)
            _start_slurmdbd(grid.dir, plan.conf, munge_socket, plan.ports.dbd, db, plan.chroot)
    # Start every controller before waiting on any: their start-up delays overlap.
    for plan in sorted(plans, key=lambda p: p.ports.dbd is not None):
        if plan.ports.dbd is not None:
            _register_cluster(plan.conf, plan.chroot, plan.layout.name, plan.net, plan.ports.dbd)
        _start_controller_and_nodes(grid.dir, plan.layout, plan.conf, plan.net, plan.chroot)
    clusters = []
    for plan in plans:
        lay, net = plan.layout, plan.net
        token = _fetch_token(plan.conf, lay.name, plan.chroot)
        accounting = plan.ports.dbd is not None
        _start_rest(grid, plan.conf, net, plan.ports.rest, plan.chroot, accounting)
        cluster = SlurmCluster(
            name=lay.name,
            rest_url=f"http://{net.address}:{plan.ports.rest}",
            token=token,
            token_env=f"GRIDCORE_SLURM_TOKEN_{lay.name.upper()}",
            conf=plan.conf,
            cpus=sum(lay.node_cpus),
            nodes=lay.node_names,
            storage_dir=plan.conf.parent / "storage",
            first_job_id=lay.first_job_id,
            address=net.address,
            host_address=net.host_address,
            netns=net.netns,
            release=lay.release,
            chroot=plan.chroot,
            accounting=accounting,
        )
        clusters.append(cluster)
        grid.env[cluster.token_env] = token
    grid.clusters = tuple(clusters)
    with requests.Session() as session:
        grid.clusters = tuple(_wait_cluster_ready(session, c) for c in clusters)
    _write_outputs(grid, layouts)


def start_grid(
    base_dir: Path,
    layouts: Sequence[ClusterLayout] = DEFAULT_LAYOUT,
    *,
    network: str | None = None,
    persistent: bool = False,
) -> SlurmGrid:
    """Start the grid under ``base_dir`` and wait until every node is idle.

    ``network``: "netns", "loopback" or "auto" (None: ``$GRIDCORE_SLURM_NETWORK``, else
    "loopback"); "netns" raises SlurmGridError if namespaces cannot be made, "auto" falls
    back to loopback with a warning. ``persistent``: the namespaces outlive this process
    (command line use) and are removed only by ``stop``, never as a stale leftover.
    On any failure, everything already started is stopped before the error propagates.
    """
    ensure_slurm_installed()
    base_dir = base_dir.resolve()
    chosen = _choose_network(network)
    if chosen == "netns":
        cleanup_stale_netns()  # a killed run's namespaces, daemons and routes
    if any(lay.accounting for lay in layouts):
        cleanup_stale_databases()  # a killed run's slurmdbd, databases and users
    # A previous run's daemons in this directory would hold its ports and PID files.
    stop_grid_dir(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    base_dir.chmod(0o755)
    _ensure_world_traversable(base_dir)
    (base_dir / MANIFEST).write_text("[]")
    grid = SlurmGrid(
        dir=base_dir, clusters=(), grid_toml=base_dir / TOML_FILE, env={}, network=chosen
    )
    try:
        _launch(grid, layouts, persistent)
    except BaseException:
        stop_grid(grid)
        raise
    return grid


# --------------------------------------------------------------------------- scheduling


def scheduler_interval(cluster: SlurmCluster) -> int | None:
    """The tick interval in the cluster's slurm.conf (None: the fast default)."""
    for line in cluster.conf.read_text().splitlines():
        if line.startswith("SchedulerParameters="):
            for item in line.split("=", 1)[1].split(","):
                if item.startswith("sched_interval="):
                    return int(item.split("=", 1)[1])
    return None


def set_scheduler_interval(cluster: SlurmCluster, interval_s: int | None) -> bool:
    """Give a running cluster a new tick interval (None: the fast default).

    Between two intervals (N -> M, both sched/builtin) this is ``scontrol reconfigure``:
    no restart, running and pending jobs untouched; slurmctld keeps its old tick grid
    for one more tick. Between the fast default (sched/backfill) and an interval the
    SchedulerType changes, which Slurm 22.05 refuses to reconfigure ("SchedulerType
    change requires restart of the slurmctld daemon"), so slurmctld is restarted (its
    jobs survive in StateSaveLocation). For a cluster that must go fast and slow again
    without restarts, use ``interval_s=1`` as its fast setting. Returns True if
    slurmctld was restarted.
    """
    old = cluster.conf.read_text().splitlines()
    lines = [
        line for line in old if not line.startswith(("SchedulerType=", "SchedulerParameters="))
    ]
    at = next(i for i, line in enumerate(lines) if line.startswith("SelectTypeParameters=")) + 1
    lines[at:at] = _scheduler_lines(interval_s)
    cluster.conf.write_text("\n".join(lines) + "\n")
    type_of = [line for line in old if line.startswith("SchedulerType=")]
    if type_of == [line for line in lines if line.startswith("SchedulerType=")]:
        _scontrol(cluster, "reconfigure")
        return False
    restart_controller(cluster)
    return True


def restart_controller(cluster: SlurmCluster) -> None:
    """Stop the cluster's slurmctld by its PID file and start it again from its conf
    (in its namespace); returns once it answers and every node responds again."""
    cdir = cluster.conf.parent
    pid = _pid_of(cdir / "slurmctld.pid", "slurmctld")
    if pid is not None:
        _signal_all([pid], signal.SIGTERM)
        if _wait_gone([pid], _STOP_TIMEOUT_S):
            raise SlurmGridError(f"slurmctld of {cluster.name} (pid {pid}) did not stop")
    env = {**os.environ, "SLURM_CONF": str(cluster.conf)}
    _run_daemon(
        _daemon_argv(cluster.netns, cluster.chroot, ["slurmctld", "-f", str(cluster.conf), "-i"]),
        cdir / "log" / "launch-slurmctld.log",
        f"slurmctld of {cluster.name}",
        env,
    )
    logs = [cdir / "log" / "slurmctld.log"]
    with requests.Session() as session:
        # Nodes may be busy (jobs survive the restart): responding is enough.
        _wait_for(
            lambda: _nodes_responding(session, cluster),
            f"slurmctld of {cluster.name} to answer again after its restart",
            logs,
            _START_TIMEOUT_S,
        )


def _nodes_responding(session: requests.Session, cluster: SlurmCluster) -> bool:
    if not _controller_up(session, cluster):
        return False
    nodes = _rest_get(session, cluster, "nodes").get("nodes", [])
    ok = {
        n.get("name")
        for n in nodes
        if node_states(n) & {"IDLE", "MIXED", "ALLOCATED"}
        and "NOT_RESPONDING" not in node_states(n)
    }
    return all(node in ok for node in cluster.nodes)


def _scontrol(cluster: SlurmCluster, *args: str) -> str:
    return cluster.cli(["scontrol", *args], check=True).stdout


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurmgrid", description=__doc__)
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", type=Path, required=True, help="scratch directory of the grid")
    parser.add_argument("--network", choices=NETWORKS, default=None, help=f"default ${NETWORK_ENV}")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            grid = start_grid(args.dir, network=args.network, persistent=True)
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
