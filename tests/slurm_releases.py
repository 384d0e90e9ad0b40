"""The Slurm releases of the test grid, and the Debian chroots that run the newer ones.

The host runs Debian 12's Slurm 22.05. Slurm 24.11 (Debian 13 trixie) and 26.05 (Debian
forky) need a newer libc, so each runs from a ``debootstrap --variant=minbase`` chroot
that this module builds and keeps OUTSIDE the clone, in ``$GRIDCORE_SLURM_CHROOTS``
(default ``/var/cache/gridcore-slurm``), one directory per suite. Later runs on the same
machine reuse it; a fresh machine builds it again (about 2 minutes per suite).

A build is atomic and exclusive: it holds ``<cache>/.<suite>.lock`` (flock) from start to
end, builds in ``<cache>/.<suite>.build-<pid>`` next to the cache and renames that to
``<cache>/<suite>`` only when it is complete; the marker ``/gridcore-chroot.json`` inside
it lists the packages asked for and the versions installed. A process that needs the
chroot while another builds it waits on the lock (``ensure_chroot``), then reuses it.

What is installed (``--no-install-recommends``): the Slurm daemons and tools, munge,
slurmrestd with the JWT plugin, and ``python3`` (pilots run ``python3 -``; it also pulls
in the shared libraries the stdlib's extension modules need, which the suite's own
interpreter, bind-mounted into jobs, needs too). Whatever system library the suite's
interpreter or its venv's extension modules still miss in the chroot is looked up on the
host (``dpkg -S``) and installed under the same package name (or its ``t64`` successor).

Packages come only from the Debian mirror the host's apt already uses
(``/etc/apt/sources.list`` or ``sources.list.d``).

Command line (from the repository root)::

    python -m tests.slurm_releases build [RELEASE ...]   # default: every chroot release
    python -m tests.slurm_releases build --background    # detached; `make test` does this
    python -m tests.slurm_releases status
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "GRIDCORE_SLURM_CHROOTS"
DEFAULT_CACHE = Path("/var/cache/gridcore-slurm")
MARKER = "gridcore-chroot.json"
# Bump when what a chroot holds changes in a way the package list does not show.
FORMAT = 1
SLURM_PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    "slurmrestd",
    "slurm-wlm-jwt-plugin",
)
# Pilots run `python3 -`; python3 also brings the libraries of the stdlib's extensions.
# Test jobs look at their addresses (`ip`) and processes (`ps`).
JOB_PACKAGES = ("python3", "libstdc++6", "iproute2", "procps")
PACKAGES = SLURM_PACKAGES + JOB_PACKAGES
# Slurm accounting, in the chroot of a release whose cluster has it (Release.accounting):
# slurmdbd (it brings the MariaDB client library its accounting_storage/mysql loads) and
# sacctmgr/sacct (in slurm-client).
ACCOUNTING_PACKAGES = ("slurmdbd",)
# A sane PATH inside a chroot (daemons live in /usr/sbin).
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_BUILD_TIMEOUT_S = 1200
# Extension modules of the stdlib that jobs never load (Tk, and NIS which needs Kerberos).
_UNUSED_EXTENSIONS = ("_tkinter", "nis.")
_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib", "lib", "usr/lib64")
_DEBIAN_SUITE = re.compile(r"\b(bookworm|trixie|forky|sid|bullseye|stable|testing|unstable)\b")


class ChrootError(RuntimeError):
    """A chroot could not be built or used."""


@dataclass(frozen=True)
class Release:
    """A Slurm release of the grid: ``suite`` None runs the host's own Slurm."""

    version: str
    # The newest REST version its slurmrestd serves (what the grid finds at start-up).
    rest_api: str
    suite: str | None = None
    # debootstrap's script for the suite (forky has none of its own: sid's works).
    script: str | None = None
    # The suite's Release files may be past their Valid-Until date (forky).
    ignore_valid_until: bool = False
    # Its chroot also holds slurmdbd (ACCOUNTING_PACKAGES), for a cluster with accounting.
    accounting: bool = False

    @property
    def in_chroot(self) -> bool:
        return self.suite is not None

    @property
    def packages(self) -> tuple[str, ...]:
        """What its chroot holds (besides the libraries the suite's interpreter needs)."""
        return PACKAGES + (ACCOUNTING_PACKAGES if self.accounting else ())


HOST_RELEASE = "22.05"
RELEASES = {
    "22.05": Release("22.05", "v0.0.38"),
    "24.11": Release("24.11", "v0.0.42", "trixie", "trixie"),
    "26.05": Release("26.05", "v0.0.45", "forky", "sid", ignore_valid_until=True, accounting=True),
}


def release(version: str) -> Release:
    try:
        return RELEASES[version]
    except KeyError:
        raise ChrootError(
            f"unknown Slurm release {version!r} (known: {', '.join(RELEASES)})"
        ) from None


def chroot_releases() -> list[Release]:
    return [rel for rel in RELEASES.values() if rel.in_chroot]


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def chroot_dir(rel: Release) -> Path:
    if rel.suite is None:
        raise ChrootError(f"Slurm {rel.version} runs on the host, not in a chroot")
    return cache_root() / rel.suite


# --------------------------------------------------------------------------- state


def marker(root: Path) -> dict[str, object] | None:
    try:
        loaded: dict[str, object] = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return loaded


def is_ready(rel: Release) -> bool:
    """The chroot exists, is complete (its marker) and holds every package asked for."""
    found = marker(chroot_dir(rel))
    return found is not None and found.get("format") == FORMAT and _holds(found, rel.packages)


def _holds(found: dict[str, object], wanted: Sequence[str]) -> bool:
    packages = found.get("packages")
    return isinstance(packages, list) and set(wanted) <= set(packages)


@contextlib.contextmanager
def build_lock(rel: Release) -> Iterator[None]:
    """Held for a whole build; ``ensure_chroot`` waits on it while another process builds."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{rel.suite}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_chroot(rel: Release, log: Path | None = None) -> Path:
    """The release's chroot, built first if it is missing or incomplete (waits for a
    build another process is running). Raises ChrootError if it cannot be built."""
    root = chroot_dir(rel)
    if is_ready(rel):
        return root
    log = log or cache_root() / f"{rel.suite}.build.log"
    with build_lock(rel):
        found = marker(root)
        if is_ready(rel):
            pass
        elif found and found.get("format") == FORMAT:
            if _mounts_under(root) and _holds(found, PACKAGES):
                # A grid uses it (or left its mounts) and only packages such as slurmdbd
                # are missing: add them beside it; failing that, use it as it is (its
                # cluster runs without accounting) and let an unused start complete it.
                with contextlib.suppress(ChrootError, OSError, subprocess.SubprocessError):
                    _add_in_use(rel, root, found, log)
                return root
            _complete(rel, root, found, log)
        else:
            _build(rel, log)
    return root


# --------------------------------------------------------------------------- mirror


def _sources_entries(text: str, deb822: bool) -> Iterator[tuple[str, list[str]]]:
    """(URI, suites) of each ``deb`` entry of an apt sources file."""
    if not deb822:
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == ["deb"]:
                words = [w for w in words[1:] if not w.startswith("[")]
                if len(words) >= 2:
                    yield words[0], [words[1]]
        return
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if ":" in line and not line.startswith("#"):
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split()


def debian_mirror() -> str:
    """The Debian archive (not the security one) that this host's apt uses."""
    files = [Path("/etc/apt/sources.list")]
    files += sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    files += sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri, suites in _sources_entries(text, path.suffix == ".sources"):
            plain = [s for s in suites if _DEBIAN_SUITE.fullmatch(s)]
            if plain and "security" not in uri and uri.startswith(("http://", "https://")):
                return uri.rstrip("/")
    raise ChrootError("no Debian archive found in /etc/apt/sources.list{,.d}")


# --------------------------------------------------------------------------- mounts


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo)."""
    prefix = str(path.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def _remove_tree(path: Path) -> None:
    """rm -rf a chroot that must hold no mounts (a bind mount of a host directory would
    have its contents deleted); refuses if it does."""
    mounted = _mounts_under(path)
    if mounted:
        raise ChrootError(f"refusing to delete {path}: mounts inside it: {', '.join(mounted)}")
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True, timeout=300)


@dataclass(frozen=True)
class Mount:
    """A mount into a chroot: ``target`` is the host path of the mount point (inside the
    chroot directory); ``kind`` is "proc", "sysfs", "bind" or "rbind" (with submounts)."""

    target: str
    kind: str
    source: str = ""
    read_only: bool = False

    @property
    def recursive(self) -> bool:
        return self.kind == "rbind"

    def as_record(self) -> dict[str, object]:
        return {"target": self.target, "kind": self.kind, "source": self.source}


def system_mounts(root: Path) -> list[Mount]:
    """proc, sys, dev (with pts, shm, mqueue) of the host, as the daemons and jobs need.
    Bind mounts, not new proc/sysfs ones: binds stack, so two grids can use one chroot at
    once (mount refuses a second sysfs on a mount point that has one)."""
    return [
        Mount(str(root / "proc"), "bind", "/proc"),
        Mount(str(root / "sys"), "bind", "/sys"),
        Mount(str(root / "dev"), "rbind", "/dev"),
    ]


def bind_mounts(root: Path, shared: Sequence[Path], read_only: Sequence[Path]) -> list[Mount]:
    """Host directories at the SAME path inside the chroot: ``shared`` read-write, then
    ``read_only``; a directory inside one already bound is not bound again."""
    mounts: list[Mount] = []
    bound: list[Path] = []
    for sources, ro in ((shared, False), (read_only, True)):
        for source in sources:
            path = source.resolve()
            if any(path == b or b in path.parents for b in bound):
                continue
            bound.append(path)
            kind = "rbind" if _mounts_under(path) else "bind"
            mounts.append(Mount(str(root / str(path).lstrip("/")), kind, str(path), ro))
    return mounts


def missing_dirs(target: Path) -> list[str]:
    """The directories ``mkdir -p target`` would create, outermost first."""
    missing = []
    for directory in (target, *target.parents):
        if directory.exists():
            break
        missing.append(str(directory))
    return list(reversed(missing))


def do_mount(spec: Mount) -> None:
    """Make the mount (its mount point must exist). Binds become slaves of their source
    at once: with shared propagation, unmounting a bound /dev/pts would otherwise also
    unmount the host's."""
    target = spec.target
    if spec.kind in ("proc", "sysfs"):
        argv = ["mount", "-t", spec.kind, spec.kind, target]
    else:
        argv = ["mount", f"--{spec.kind}", spec.source, target]
    _mount_cmd(argv)
    if spec.kind in ("bind", "rbind"):
        _mount_cmd(["mount", "--make-rslave", target])
        if spec.read_only:
            _mount_cmd(["mount", "-o", "remount,bind,ro", target])


def undo_mount(target: str, recursive: bool) -> bool:
    """Unmount (recursively for an rbind); lazily if busy. False if nothing was there."""
    if target not in _mounts_under(Path(target)):
        return False
    flags = ["-R"] if recursive else []
    done = subprocess.run(
        ["umount", *flags, target], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        subprocess.run(["umount", *flags, "-l", target], capture_output=True, timeout=30)
    return True


def _mount_cmd(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise ChrootError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")


@contextlib.contextmanager
def _build_mounts(root: Path) -> Iterator[None]:
    """proc and dev for the package scripts of a build; unmounted afterwards."""
    done: list[Mount] = []
    try:
        for spec in (Mount(str(root / "proc"), "proc"), Mount(str(root / "dev"), "rbind", "/dev")):
            Path(spec.target).mkdir(parents=True, exist_ok=True)
            do_mount(spec)
            done.append(spec)
        yield
    finally:
        for spec in reversed(done):
            undo_mount(spec.target, spec.recursive)


# --------------------------------------------------------------------------- building


def _run(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=_BUILD_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise ChrootError(f"`{' '.join(argv)}` failed ({done.returncode}):\n{tail}")


def _ensure_debootstrap(log: Path) -> str:
    found = shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], log, env)
    _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"], log, env)
    found = shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not found:
        raise ChrootError("debootstrap is still missing after apt-get install")
    return found


def _chroot_env() -> dict[str, str]:
    return {
        "PATH": CHROOT_PATH,
        "DEBIAN_FRONTEND": "noninteractive",
        "LC_ALL": "C",
        "HOME": "/root",
    }


def _apt_install(root: Path, packages: Sequence[str], log: Path) -> None:
    argv = ["chroot", str(root), "apt-get", "install", "-y", "-q", "--no-install-recommends"]
    _run([*argv, *packages], log, _chroot_env())


def _configure(rel: Release, root: Path) -> None:
    """What a minbase chroot needs before apt and the daemons work in it."""
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\n# gridcore test grid: packages start no service\nexit 101\n")
    policy.chmod(0o755)
    if rel.ignore_valid_until:
        (root / "etc/apt/apt.conf.d/99gridcore-valid-until").write_text(
            'Acquire::Check-Valid-Until "false";\n'
        )
    # minbase has no /etc/hosts; scontrol hangs resolving localhost without one.
    shutil.copyfile("/etc/hosts", root / "etc/hosts")


def _build(rel: Release, log: Path) -> None:
    """debootstrap + packages into a temporary directory, renamed into place at the end.
    Called with the build lock held."""
    cache = cache_root()
    target = chroot_dir(rel)
    for stale in cache.glob(f".{rel.suite}.build-*"):  # a killed build's leftovers
        _remove_tree(stale)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"building the Slurm {rel.version} chroot ({rel.suite}) at {target}\n")
    debootstrap = _ensure_debootstrap(log)
    mirror = debian_mirror()
    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{rel.suite}.build-{os.getpid()}-", dir=cache))
    # mkdtemp's 0700 would keep package scripts that switch user (munge's) out of it.
    tmp.chmod(0o755)
    try:
        argv = [debootstrap, "--variant=minbase", str(rel.suite), str(tmp), mirror]
        script = Path("/usr/share/debootstrap/scripts") / str(rel.script)
        _run([*argv, str(script)] if rel.script != rel.suite else argv, log)
        debootstrap_s = time.monotonic() - began
        _configure(rel, tmp)
        with _build_mounts(tmp):
            _run(["chroot", str(tmp), "apt-get", "update", "-q"], log, _chroot_env())
            _apt_install(tmp, rel.packages, log)
            extra = _install_missing_libraries(tmp, log)
            _run(["chroot", str(tmp), "apt-get", "clean"], log, _chroot_env())
        versions = _installed_versions(tmp, [*rel.packages, *extra])
        (tmp / MARKER).write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "release": rel.version,
                    "suite": rel.suite,
                    "mirror": mirror,
                    "packages": [*rel.packages, *extra],
                    "versions": versions,
                    "debootstrap_s": round(debootstrap_s, 1),
                    "build_s": round(time.monotonic() - began, 1),
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
                indent=1,
            )
        )
        if target.exists():  # an incomplete or outdated chroot
            if _mounts_under(target):
                raise ChrootError(f"cannot replace {target}: a running grid uses it")
            old = cache / f".{rel.suite}.build-{os.getpid()}-old"
            target.rename(old)
            _remove_tree(old)
        tmp.rename(target)
    except BaseException:
        with contextlib.suppress(ChrootError, OSError, subprocess.SubprocessError):
            _remove_tree(tmp)
        raise
    with log.open("a") as out:
        out.write(f"done in {time.monotonic() - began:.1f} s\n")


def _complete(rel: Release, root: Path, found: dict[str, object], log: Path) -> None:
    """A complete chroot of the same format that lacks packages added to PACKAGES (or
    the release's ``packages``, e.g. slurmdbd) since it was built: install them in place;
    the marker is rewritten only afterwards."""
    if _mounts_under(root):
        raise ChrootError(f"the Slurm {rel.version} chroot {root} lacks packages but is in use")
    with log.open("a") as out:
        out.write(f"adding packages to the Slurm {rel.version} chroot at {root}\n")
    began = time.monotonic()
    with _build_mounts(root):
        _run(["chroot", str(root), "dpkg", "--configure", "-a"], log, _chroot_env())
        _run(["chroot", str(root), "apt-get", "update", "-q"], log, _chroot_env())
        _apt_install(root, rel.packages, log)
        extra = _install_missing_libraries(root, log)
        _run(["chroot", str(root), "apt-get", "clean"], log, _chroot_env())
    _rewrite_marker(root, found, [*rel.packages, *extra], began)


def _add_in_use(rel: Release, root: Path, found: dict[str, object], log: Path) -> None:
    """Install the packages the marker lacks (e.g. slurmdbd) into a chroot that a grid
    has mounted, as apt adds a package on a live server: with the grid's proc and dev
    (mounting and unmounting our own would pull the grid's /dev submounts with them), and
    Slurm packages pinned to the Slurm version installed, so nothing the grid runs is
    upgraded. Raises ChrootError if that version is no longer in the mirror."""
    if not (root / "proc/self").exists() or not (root / "dev/null").exists():
        raise ChrootError(f"{root} is in use without proc and dev mounted")
    have = found.get("packages")
    missing = [p for p in rel.packages if not isinstance(have, list) or p not in have]
    versions = found.get("versions")
    slurm = versions.get("slurmctld") if isinstance(versions, dict) else None
    pinned = [f"{p}={slurm}" if slurm and p.startswith("slurm") else p for p in missing]
    with log.open("a") as out:
        out.write(f"adding {' '.join(pinned)} to the Slurm {rel.version} chroot in use\n")
    began = time.monotonic()
    _run(["chroot", str(root), "apt-get", "update", "-q"], log, _chroot_env())
    _apt_install(root, pinned, log)
    _run(["chroot", str(root), "apt-get", "clean"], log, _chroot_env())
    _rewrite_marker(root, found, missing, began)


def _rewrite_marker(
    root: Path, found: dict[str, object], added: Sequence[str], began: float
) -> None:
    have = found.get("packages")
    packages = sorted({*added, *(have if isinstance(have, list) else [])})
    found = {
        **found,
        "packages": packages,
        "versions": _installed_versions(root, packages),
        "completed_s": round(time.monotonic() - began, 1),
    }
    tmp = root / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(found, indent=1))
    tmp.rename(root / MARKER)


def _installed_versions(root: Path, packages: Sequence[str]) -> dict[str, str]:
    done = subprocess.run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Package} ${Version}\n", *packages],
        capture_output=True,
        text=True,
        env=_chroot_env(),
        timeout=60,
        check=False,
    )
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


# --------------------------------------------------------------------------- libraries


def interpreter_files() -> list[Path]:
    """The suite's interpreter and every extension module jobs may load from it: the
    binary, libpython, the stdlib's extension modules (not Tk) and the venv's."""
    base = Path(sys.base_prefix)
    files = [Path(sys.executable).resolve()]
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlibrary = sysconfig.get_config_var("LDLIBRARY")
    if libdir and ldlibrary and (Path(libdir) / ldlibrary).is_file():
        files.append(Path(libdir) / ldlibrary)
    dynload = Path(sysconfig.get_paths(vars={"base": str(base), "platbase": str(base)})["stdlib"])
    files += [
        so
        for so in (dynload / "lib-dynload").glob("*.so")
        if not so.name.startswith(_UNUSED_EXTENSIONS)
    ]
    site = Path(sysconfig.get_paths()["platlib"])
    if site.is_dir():
        files += [so for so in site.rglob("*.so") if so.is_file()]
    return files


def system_libraries(files: Sequence[Path]) -> dict[str, Path]:
    """soname -> host path of every system library (outside the interpreter's and the
    venv's own trees) that ``files`` load, per ``ldd``."""
    own = (str(Path(sys.base_prefix).resolve()), str(Path(sys.prefix).resolve()))
    found: dict[str, Path] = {}
    for start in range(0, len(files), 200):
        done = subprocess.run(
            ["ldd", *map(str, files[start : start + 200])],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        for line in done.stdout.splitlines():
            words = line.split()
            if len(words) >= 3 and words[1] == "=>" and words[2].startswith("/"):
                resolved = str(Path(words[2]).resolve())
                if not resolved.startswith(own):
                    found.setdefault(words[0], Path(words[2]))
    return found


def missing_libraries(root: Path) -> dict[str, Path]:
    """The system libraries the suite's interpreter needs that ``root`` lacks."""
    needed = system_libraries(interpreter_files())
    return {
        soname: host_path
        for soname, host_path in needed.items()
        if not any((root / lib_dir / soname).exists() for lib_dir in _LIB_DIRS)
    }


def _host_package(path: Path) -> str | None:
    done = subprocess.run(
        ["dpkg", "-S", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        done = subprocess.run(
            ["dpkg", "-S", str(path.resolve())],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    if done.returncode != 0 or ":" not in done.stdout:
        return None
    return done.stdout.split(":", 1)[0].split(",")[0].strip()


def _install_missing_libraries(root: Path, log: Path) -> list[str]:
    """Install, under the host's package name (or its t64 successor), every library the
    suite's interpreter needs and the chroot lacks; returns the packages installed."""
    missing = missing_libraries(root)
    wanted = sorted({pkg for pkg in map(_host_package, missing.values()) if pkg})
    installed = []
    for pkg in wanted:
        for candidate in (pkg, f"{pkg}t64"):
            try:
                _apt_install(root, [candidate], log)
            except ChrootError:
                continue
            installed.append(candidate)
            break
    still = missing_libraries(root)
    if still:
        with log.open("a") as out:
            out.write(f"WARNING: libraries still missing in the chroot: {', '.join(still)}\n")
    return installed


# --------------------------------------------------------------------------- CLI


def _build_all(releases: Sequence[Release]) -> int:
    """Build every release at once (each under its own lock); 1 if one failed."""
    failures: dict[str, str] = {}

    def one(rel: Release) -> None:
        began = time.monotonic()
        try:
            ensure_chroot(rel)
        except (ChrootError, OSError, subprocess.SubprocessError) as exc:
            failures[rel.version] = str(exc)
            return
        print(f"Slurm {rel.version}: {chroot_dir(rel)} ready ({time.monotonic() - began:.1f} s)")

    threads = [threading.Thread(target=one, args=(rel,)) for rel in releases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for version, reason in failures.items():
        print(f"Slurm {version}: chroot build FAILED: {reason}", file=sys.stderr)
    return 1 if failures else 0


def _build_in_background(releases: Sequence[Release]) -> int:
    """Start ``build`` as a detached process unless every chroot is ready; returns at
    once. Whoever needs a chroot later waits for that build on its lock."""
    missing = [rel for rel in releases if not is_ready(rel)]
    if not missing:
        print(f"Slurm chroots ready in {cache_root()}")
        return 0
    cache_root().mkdir(parents=True, exist_ok=True)
    log = cache_root() / "background-build.log"
    argv = [sys.executable, "-m", "tests.slurm_releases", "build", *(r.version for r in missing)]
    with log.open("w") as out:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,
        )
    names = ", ".join(f"{r.version} ({r.suite})" for r in missing)
    print(f"building Slurm chroots {names} in the background (log: {log})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurm_releases", description=__doc__)
    parser.add_argument("action", choices=("build", "status"))
    parser.add_argument("releases", nargs="*", help="e.g. 24.11 26.05 (default: all)")
    parser.add_argument(
        "--background", action="store_true", help="build: start it detached, return at once"
    )
    args = parser.parse_args(argv)
    try:
        releases = [release(v) for v in args.releases] or chroot_releases()
    except ChrootError as exc:
        parser.error(str(exc))
    releases = [rel for rel in releases if rel.in_chroot]
    if args.action == "build":
        return _build_in_background(releases) if args.background else _build_all(releases)
    for rel in releases:
        state = "ready" if is_ready(rel) else "missing"
        print(f"Slurm {rel.version} ({rel.suite}): {chroot_dir(rel)} {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
