"""Staging over SFTP to a real OpenSSH server: this test starts its own sshd on a free
loopback port (host and client keys in a temporary directory, key login only) and stops
it by its pid file. Under CI=true an sshd that cannot start FAILS the test."""

from __future__ import annotations

import getpass
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gridcore.config import parse_grid
from gridcore.errors import StagingError
from gridcore.model import MB, ORIGIN, GridSpec
from gridcore.staging import (
    ReplicaCatalog,
    StorageOptions,
    register_source,
    stage,
    stage_measured,
    sweep_partials,
)
from gridcore.state.store import open_store

START_TIMEOUT_S = 10.0
SIZE = 4 * MB


@dataclass(frozen=True)
class Sshd:
    port: int
    user: str
    client_key: Path

    def url(self, path: Path) -> str:
        return f"sftp://{self.user}@127.0.0.1:{self.port}{path}"

    @property
    def options(self) -> StorageOptions:
        return {
            "sftp": {
                "key_filename": str(self.client_key),
                "look_for_keys": False,
                "allow_agent": False,
                "timeout": 10,
            }
        }


def _unavailable(problem: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _write_config(base: Path, port: int) -> Path:
    config = base / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {base / 'host_key'}",
                f"AuthorizedKeysFile {base / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                f"PidFile {base / 'sshd.pid'}",
                "UsePAM no",
                "StrictModes no",
                "Subsystem sftp internal-sftp",
                "",
            ]
        )
    )
    return config


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.access(binary, os.X_OK) or shutil.which("ssh-keygen") is None:
        _unavailable("OpenSSH server not installed (apt-get install openssh-server)")
    base = tmp_path_factory.mktemp("sshd")
    _keygen(base / "host_key")
    _keygen(base / "client_key")
    shutil.copy(base / "client_key.pub", base / "authorized_keys")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
    port = _free_port()
    config = _write_config(base, port)
    log = base / "sshd.log"
    proc = subprocess.Popen([binary, "-D", "-f", str(config), "-E", str(log)])
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _listening(port) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid_file = base / "sshd.pid"
    try:
        if not _listening(port):
            detail = log.read_text() if log.exists() else ""
            _unavailable(f"sshd did not start on 127.0.0.1:{port}: {detail.strip()}")
        yield Sshd(port, getpass.getuser(), base / "client_key")
    finally:
        if proc.poll() is None:
            pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else proc.pid
            os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=10)


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[ReplicaCatalog]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}", upgrade=True)
    try:
        yield ReplicaCatalog(store)
    finally:
        store.dispose()


@pytest.fixture
def grid(tmp_path: Path, sshd: Sshd) -> GridSpec:
    return parse_grid(
        {
            "version": 1,
            "sites": {
                # a cluster whose storage this host reaches only over SFTP
                "remote": {
                    "kind": "slurm",
                    "processors": 1,
                    "url": "http://127.0.0.1:9",
                    "token": {"env": "UNUSED_TOKEN"},
                    "storage_dir": sshd.url(tmp_path / "remote"),
                },
                "near": {"kind": "local", "processors": 1, "storage_dir": str(tmp_path / "near")},
            },
            "bandwidth": {"origin": {"remote": 50.0, "near": 10.0}, "remote": {"near": 500.0}},
        }
    )


def _source(tmp_path: Path, catalog: ReplicaCatalog, size: int = SIZE) -> Path:
    src = tmp_path / "inputs" / "mesh.dat"
    src.parent.mkdir(parents=True)
    src.write_bytes(os.urandom(size))
    register_source(catalog, "data/mesh.dat", ORIGIN, str(src))
    return src


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_is_staged_over_sftp_and_published_atomically(
    tmp_path: Path, sshd: Sshd, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = _source(tmp_path, catalog)
    remote_dir = tmp_path / "remote" / "replicas" / "data"
    final = remote_dir / "mesh.dat"
    seen: list[tuple[bool, list[str]]] = []

    def watch(done: int, total: int) -> None:
        if not seen and done >= total // 2:  # midway: only a hidden .part exists
            seen.append((final.exists(), sorted(p.name for p in remote_dir.iterdir())))

    staged = stage_measured(
        catalog, grid, "data/mesh.dat", "remote", storage_options=sshd.options, progress=watch
    )

    ((final_visible, midway),) = seen
    assert final_visible is False
    assert len(midway) == 1 and midway[0].startswith(".mesh.dat.part-")
    assert staged.replica.url == sshd.url(final)
    assert staged.replica.checksum == _sha256(final) == _sha256(src)
    assert [p.name for p in remote_dir.iterdir()] == ["mesh.dat"]
    assert staged.mbps is not None and staged.mbps > 0
    assert catalog.measured_rate(ORIGIN, "remote") == pytest.approx(staged.mbps)
    print(f"sftp staging: {SIZE / MB:.0f} MB in {staged.seconds:.3f} s = {staged.mbps:.1f} MB/s")


def test_a_file_is_staged_from_an_sftp_replica(
    tmp_path: Path, sshd: Sshd, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = _source(tmp_path, catalog)
    stage(catalog, grid, "data/mesh.dat", "remote", storage_options=sshd.options)

    staged = stage_measured(catalog, grid, "data/mesh.dat", "near", storage_options=sshd.options)

    assert staged.source is not None and staged.source.site == "remote"  # 500 vs 10 MB/s
    assert _sha256(Path(staged.replica.url)) == _sha256(src)


def test_a_failed_sftp_transfer_leaves_nothing_remote(
    tmp_path: Path, sshd: Sshd, catalog: ReplicaCatalog, grid: GridSpec
) -> None:
    src = _source(tmp_path, catalog)
    src.write_bytes(os.urandom(SIZE))  # no longer the registered content

    with pytest.raises(StagingError, match="checksum mismatch") as failure:
        stage(catalog, grid, "data/mesh.dat", "remote", storage_options=sshd.options)

    assert sshd.url(tmp_path / "remote" / "replicas" / "data" / "mesh.dat") in str(failure.value)
    assert catalog.replica("data/mesh.dat", "remote") is None
    assert list((tmp_path / "remote" / "replicas" / "data").iterdir()) == []


def test_partials_are_swept_over_sftp(tmp_path: Path, sshd: Sshd) -> None:
    directory = tmp_path / "remote" / "replicas"
    directory.mkdir(parents=True)
    part = directory / f".mesh.dat.part-{'a' * 32}"
    part.write_bytes(b"partial")
    os.utime(part, (time.time() - 3600, time.time() - 3600))

    removed = sweep_partials(sshd.url(directory), 600, storage_options=sshd.options)

    assert removed == (str(part),)
    assert not part.exists()
