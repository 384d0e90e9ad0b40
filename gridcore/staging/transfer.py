"""Staging: copy a logical file to a site, atomically and checksum-verified.

A transfer streams the source replica (fsspec: local paths, or ``sftp://user@host:port/
path`` for remote storage) into a hidden temporary file in the destination directory,
``.<name>.part-<uuid>``, hashing the bytes as they pass. Only when the bytes match the
source replica's size and sha256 is the file synced and renamed to its final name (a
rename within one directory is atomic, locally and with SFTP's posix-rename), and only
then is it registered in the catalog, together with the measured rate. Any failure
removes the temporary file (best effort) and registers nothing, so a reader never sees a
partial file under a final name and the catalog never lists one. A process killed
mid-copy leaves only the hidden ``.part-*`` file, which :func:`sweep_partials` removes.

A site's storage is remote when its ``storage_dir`` in the grid description is a URL
(``sftp://user@host:port/path``); a plain path is a directory on this machine. SFTP
credentials come from the usual SSH places (agent, ``~/.ssh``) or from
``storage_options={"sftp": {"key_filename": ...}}`` (passed to paramiko's connect).
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fsspec.core import url_to_fs

from gridcore.errors import ConfigError, GridError, StagingError
from gridcore.model import MB, GridSpec, Replica, SiteKind, SiteSpec
from gridcore.staging.catalog import ReplicaCatalog, check_logical_name
from gridcore.state import capacity
from gridcore.state.capacity import HolderKind
from gridcore.state.store import state_dir

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024
REPLICA_DIR = "replicas"
# Below this size a transfer's time is latency, not bandwidth: not recorded as a rate.
MIN_RATE_SAMPLE_BYTES = MB
_PART = re.compile(r"^\..+\.part-[0-9a-f]{32}$")
_SFTP_CMD_EXTENDED = 200  # SSH_FXP_EXTENDED (draft-ietf-secsh-filexfer-02, section 8)

Progress = Callable[[int, int], None]
"""Called after every chunk with (bytes copied, bytes expected)."""
StorageOptions = Mapping[str, Mapping[str, Any]]
"""fsspec filesystem arguments by protocol, e.g. ``{"sftp": {"key_filename": "..."}}``."""


@dataclass(frozen=True)
class StagedFile:
    """The outcome of staging one file: the replica at the destination, the replica it
    was copied from (None when the file was already there), the measured transfer time
    and rate, and the time estimated before the transfer."""

    replica: Replica
    source: Replica | None
    seconds: float
    mbps: float | None
    estimated_s: float

    @property
    def skipped(self) -> bool:
        return self.source is None


def stage(
    catalog: ReplicaCatalog,
    grid: GridSpec,
    logical_name: str,
    dst_site: str,
    *,
    dst_url: str | None = None,
    storage_options: StorageOptions | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Progress | None = None,
) -> Replica:
    """Make ``logical_name`` available at ``dst_site``; returns its replica there.

    See :func:`stage_measured`, which also reports the transfer's time and rate."""
    return stage_measured(
        catalog,
        grid,
        logical_name,
        dst_site,
        dst_url=dst_url,
        storage_options=storage_options,
        chunk_bytes=chunk_bytes,
        progress=progress,
    ).replica


def stage_measured(
    catalog: ReplicaCatalog,
    grid: GridSpec,
    logical_name: str,
    dst_site: str,
    *,
    dst_url: str | None = None,
    storage_options: StorageOptions | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Progress | None = None,
) -> StagedFile:
    """Copy ``logical_name`` to ``dst_site`` (to ``dst_url``, default
    ``<storage_dir>/replicas/<logical_name>``) from the replica with the smallest
    estimated transfer time, falling back to the next one if a source fails.

    A replica already registered at ``dst_site`` (at ``dst_url``, if given) is returned
    without a transfer. Raises ConfigError (unknown site, no storage), RequestError
    (malformed or unregistered name) before any transfer, StagingError if every source
    failed; in every failure nothing is registered and no partial file is visible.
    """
    spec = grid.site(dst_site)
    found = catalog.require(logical_name)
    if chunk_bytes <= 0:
        raise StagingError(f"chunk_bytes must be positive, got {chunk_bytes}")
    here = next((r for r in found if r.site == dst_site), None)
    if here is not None and (dst_url is None or _absolute(dst_url) == here.url):
        return StagedFile(here, None, 0.0, None, 0.0)
    url = _absolute(dst_url or default_replica_url(spec, logical_name))
    # The replica's bytes are a volume hold of the capacity ledger from before the copy
    # for as long as it is registered; a copy that fails gives them back.
    claimed = claim_volume(catalog, grid, found[0], dst_site)
    try:
        return _transfer_from_best(
            catalog, grid, found, dst_site, url, storage_options, chunk_bytes, progress
        )
    except BaseException:
        if claimed:
            release_volume(catalog, logical_name, dst_site)
        raise


def claim_volume(catalog: ReplicaCatalog, grid: GridSpec, replica: Replica, site: str) -> bool:
    """Claim ``replica``'s bytes at ``site`` (a volume hold) unless it holds them already;
    True if claimed now. Refuses with StagingError when they do not fit the site's
    storage (``storage_bytes`` in the grid description)."""
    holder = capacity.volume_holder(replica.logical_name, site)
    with catalog.store.begin() as conn:
        capacity.register_sites(conn, grid)
        held = capacity.hold(conn, HolderKind.VOLUME, holder)
        if held is not None and held.ledger is not None:
            return False
        if capacity.claim(conn, HolderKind.VOLUME, holder, site, 0, replica.size_bytes) is None:
            usage = capacity.usage(conn)[site]
            raise StagingError(
                f"staging {replica.logical_name!r} to site {site}: {replica.size_bytes} bytes"
                f" do not fit its storage ({usage.storage_claimed} of {usage.storage_total}"
                " bytes held already)"
            )
    return True


def release_volume(catalog: ReplicaCatalog, logical_name: str, site: str) -> bool:
    """Give the bytes of ``logical_name`` at ``site`` back to the ledger (exactly once)."""
    holder = capacity.volume_holder(logical_name, site)
    with catalog.store.begin() as conn:
        return capacity.release(conn, HolderKind.VOLUME, holder)


def _transfer_from_best(
    catalog: ReplicaCatalog,
    grid: GridSpec,
    found: tuple[Replica, ...],
    dst_site: str,
    url: str,
    storage_options: StorageOptions | None,
    chunk_bytes: int,
    progress: Progress | None,
) -> StagedFile:
    logical_name = found[0].logical_name
    failures = []
    for estimated_s, source in catalog.rank_sources(grid, found, dst_site):
        try:
            return _transfer(
                catalog, source, dst_site, url, estimated_s, storage_options, chunk_bytes, progress
            )
        except StagingError as exc:
            log.warning("%s", exc)
            failures.append(str(exc))
    if len(failures) == 1:
        raise StagingError(failures[0])
    raise StagingError(
        f"staging {logical_name!r} to site {dst_site} failed from every source: "
        + "; ".join(failures)
    )


def default_replica_url(spec: SiteSpec, logical_name: str) -> str:
    """``<storage root>/replicas/<logical_name>`` (:func:`site_storage_root`)."""
    check_logical_name(logical_name)
    return f"{site_storage_root(spec)}/{REPLICA_DIR}/{logical_name}"


def site_storage_root(spec: SiteSpec) -> str:
    """The site's ``storage_dir``; a local site without one uses the local adapter's
    default (``$GRIDCORE_HOME/sites/<name>``). ConfigError for another site without one."""
    root = spec.storage_dir
    if root is None and spec.kind is SiteKind.LOCAL:
        root = str(state_dir() / "sites" / spec.name)
    if root is None:
        raise ConfigError(
            f"site {spec.name} has no storage_dir: set one in the grid description"
            " (a path, or sftp://user@host:port/path for remote storage) or pass dst_url"
        )
    return root.rstrip("/")


class Throttle:
    """A :data:`Progress` callback that paces a copy to at most ``mbps`` MB/s on
    average (it sleeps after a chunk that got ahead): emulates a slow link between two
    places on one machine (``gridcore experiment dataplan --live``). One object per
    copy, made just before it: the pace is measured from its creation."""

    def __init__(
        self,
        mbps: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (mbps > 0) or mbps == float("inf"):
            raise ConfigError(f"Throttle: mbps must be a finite rate > 0, got {mbps!r}")
        self.bytes_per_s = mbps * MB
        self.clock = clock
        self.sleep = sleep
        self._start = clock()
        self._last = 0

    def __call__(self, copied: int, expected: int) -> None:
        now = self.clock()
        if copied < self._last:  # a fallback source starts the copy again
            self._start = now
        self._last = copied
        ahead = copied / self.bytes_per_s - (now - self._start)
        if ahead > 0:
            self.sleep(ahead)


def register_source(
    catalog: ReplicaCatalog,
    logical_name: str,
    site: str,
    url: str,
    *,
    storage_options: StorageOptions | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Replica:
    """Hash an existing file and register it as a replica of ``logical_name`` at
    ``site`` (any name, including ``origin``: where inputs live before staging)."""
    check_logical_name(logical_name)
    url = _absolute(url)
    try:
        with _filesystem(url, storage_options) as (fs, path), fs.open(path, "rb") as src:
            digest = hashlib.sha256()
            size = 0
            while chunk := src.read(chunk_bytes):
                digest.update(chunk)
                size += len(chunk)
    except Exception as exc:
        raise StagingError(f"cannot register {url} as {logical_name!r}: {_cause(exc)}") from exc
    replica = Replica(logical_name, site, url, size, f"sha256:{digest.hexdigest()}")
    catalog.register(replica)
    return replica


def sweep_partials(
    directory: str,
    older_than_s: float,
    *,
    storage_options: StorageOptions | None = None,
    now: float | None = None,
) -> tuple[str, ...]:
    """Remove ``.<name>.part-<uuid>`` files left under ``directory`` (recursively) by
    killed transfers and last written more than ``older_than_s`` ago; returns their
    paths. A live transfer writes continuously, so its file is never that old."""
    url = _absolute(directory)
    cutoff = (time.time() if now is None else now) - older_than_s
    removed = []
    with _filesystem(url, storage_options) as (fs, path):
        if not fs.isdir(path):
            return ()
        for found, info in sorted(fs.find(path, detail=True).items()):
            if _PART.match(posixpath.basename(found)) and _mtime(info) < cutoff:
                fs.rm_file(found)
                removed.append(found)
    return tuple(removed)


# -- one transfer ------------------------------------------------------------------------


def _transfer(
    catalog: ReplicaCatalog,
    source: Replica,
    dst_site: str,
    url: str,
    estimated_s: float,
    storage_options: StorageOptions | None,
    chunk_bytes: int,
    progress: Progress | None,
) -> StagedFile:
    started = time.monotonic()
    try:
        with (
            _filesystem(source.url, storage_options) as (src_fs, src_path),
            _filesystem(url, storage_options) as (dst_fs, dst_path),
        ):
            _copy_and_publish(src_fs, src_path, dst_fs, dst_path, source, chunk_bytes, progress)
        seconds = max(time.monotonic() - started, 1e-9)
        mbps = source.size_bytes / MB / seconds
        replica = Replica(source.logical_name, dst_site, url, source.size_bytes, source.checksum)
        sampled = source.size_bytes >= MIN_RATE_SAMPLE_BYTES and source.site != dst_site
        catalog.register(replica, rate=(source.site, mbps) if sampled else None)
    except Exception as exc:
        raise StagingError(
            f"staging {source.logical_name!r} from site {source.site} ({source.url}) to site"
            f" {dst_site} ({url}) failed: {_cause(exc)}"
        ) from exc
    return StagedFile(replica, source, seconds, mbps, estimated_s)


def _copy_and_publish(
    src_fs: Any,
    src_path: str,
    dst_fs: Any,
    dst_path: str,
    source: Replica,
    chunk_bytes: int,
    progress: Progress | None,
) -> None:
    """Copy into a hidden temporary file beside ``dst_path``, verify, rename."""
    directory, name = posixpath.split(dst_path)
    # Hidden, and unique per transfer; a long name is cut so the temporary name stays
    # within the usual 255-byte limit (for ASCII names).
    part = posixpath.join(directory, f".{name[:200]}.part-{uuid.uuid4().hex}")
    dst_fs.makedirs(directory, exist_ok=True)
    try:
        checksum, size = _copy(src_fs, src_path, dst_fs, part, chunk_bytes, progress, source)
        if size != source.size_bytes or checksum != source.checksum:
            raise StagingError(
                f"checksum mismatch: copied {size} bytes with {checksum}, the source replica"
                f" is registered as {source.size_bytes} bytes with {source.checksum}"
            )
        written = dst_fs.size(part)
        if written != size:
            raise StagingError(f"the destination holds {written} of {size} bytes")
        _publish(dst_fs, part, dst_path)
    except BaseException:
        _discard(dst_fs, part)
        raise


def _copy(
    src_fs: Any,
    src_path: str,
    dst_fs: Any,
    part: str,
    chunk_bytes: int,
    progress: Progress | None,
    source: Replica,
) -> tuple[str, int]:
    digest = hashlib.sha256()
    done = 0
    with src_fs.open(src_path, "rb") as fin, dst_fs.open(part, "wb") as fout:
        _tune_sftp(fin, fout, source.size_bytes)
        while chunk := fin.read(chunk_bytes):
            digest.update(chunk)
            fout.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, source.size_bytes)
        _sync(fout)
    return f"sha256:{digest.hexdigest()}", done


def _tune_sftp(fin: Any, fout: Any, size: int) -> None:
    # paramiko waits for one round trip per 32 KiB request unless told otherwise: read
    # ahead on the source, and let writes run ahead of their acknowledgements (a failed
    # write still surfaces, at the latest when the file is closed).
    if hasattr(fin, "prefetch"):
        fin.prefetch(size)
    if hasattr(fout, "set_pipelined"):
        fout.set_pipelined(True)


def _sync(fout: Any) -> None:
    """Flush ``fout`` to stable storage: fsync locally; over SFTP, OpenSSH's
    fsync@openssh.com extension where the server has it (paramiko has no call for it)."""
    fout.flush()
    if hasattr(fout, "fileno"):
        os.fsync(fout.fileno())
        return
    sftp, handle = getattr(fout, "sftp", None), getattr(fout, "handle", None)
    if sftp is None or handle is None:
        return
    try:
        sftp._request(_SFTP_CMD_EXTENDED, "fsync@openssh.com", handle)
    except OSError as exc:  # an older server: the close still makes the data durable there
        log.debug("SFTP server has no fsync@openssh.com: %s", exc)


def _publish(fs: Any, part: str, final: str) -> None:
    """Rename ``part`` to ``final`` atomically, replacing any file there."""
    if _is_local(fs):
        os.replace(part, final)
        directory = os.open(os.path.dirname(final), os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a crash
        finally:
            os.close(directory)
    elif _is_sftp(fs):
        try:
            fs.ftp.posix_rename(part, final)
        except OSError:
            # No posix-rename@openssh.com: plain SFTP rename refuses to replace a file.
            if fs.exists(final):
                raise
            fs.ftp.rename(part, final)
    else:
        fs.mv(part, final)


def _discard(fs: Any, part: str) -> None:
    try:
        if fs.exists(part):
            fs.rm_file(part)
    except Exception as exc:  # best effort: sweep_partials removes what is left
        log.warning("could not remove partial file %s: %s", part, exc)


# -- filesystems -------------------------------------------------------------------------


@contextmanager
def _filesystem(url: str, storage_options: StorageOptions | None) -> Iterator[tuple[Any, str]]:
    """An fsspec filesystem of its own for ``url`` (not the shared instance cache, so
    its connection is closed here) and the path within it."""
    protocol = url.split("://", 1)[0] if _has_scheme(url) else "file"
    options = dict((storage_options or {}).get(protocol, {}))
    fs, path = url_to_fs(url, skip_instance_cache=True, **options)
    try:
        yield fs, path
    finally:
        if _is_sftp(fs):
            fs.ftp.close()
            fs.client.close()


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _is_local(fs: Any) -> bool:
    return "file" in _protocols(fs)


def _is_sftp(fs: Any) -> bool:
    return "sftp" in _protocols(fs)


def _has_scheme(url: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", url) is not None


def _absolute(url: str) -> str:
    """A URL as given; a plain path made absolute (it is stored in the catalog)."""
    return url if _has_scheme(url) else os.path.abspath(url)


def _mtime(info: Mapping[str, Any]) -> float:
    mtime = info.get("mtime", info.get("created", 0.0))
    return mtime.timestamp() if isinstance(mtime, datetime) else float(mtime)


def _cause(exc: BaseException) -> str:
    if isinstance(exc, GridError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
