"""Submission keys: the one name a site job carries back to the holder it was made for.

Every site submission gridcore makes carries a key derived from its holder, so a retry
(or a resumed engine) can ask the site whether the job already exists before submitting
it again, and a refresh can tell our jobs whose holder is gone (orphans) from the rest:

* a selection:                 ``gc-<install>-s<selection id>``
* a co-allocation component:   ``gc-<install>-c<job id>-<epoch>-<component index>``
* a health probe:              ``gc-<install>-p<site>-<token>`` (the probe's hex token)
* a pilot (VJM virtual job):   ``gc-<install>-v<pilot id>``

``<install>`` is the state database's install id (12 hex digits, ``gc_meta``): many
state databases (test schemas, several deployments) submit to the same clusters, and a
selection id is only unique within one of them. Keys use only ``[A-Za-z0-9_-]`` (site
names are letters, digits, ``-`` and ``_``), so a key is also a safe directory name.

Pure functions only; the install id is read by :func:`gridcore.engine.submission.install_id`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gridcore.model import HolderKind

KEY_PREFIX = "gc-"
KEY_MAX_LENGTH = 128
_INSTALL = re.compile(r"[0-9a-f]{12}")
_SELECTION = re.compile(r"s(\d+)")
_COMPONENT = re.compile(r"c(\d+)-(\d+)-(\d+)")
_PROBE = re.compile(r"p([A-Za-z0-9_-]+)-([0-9a-f]+)")
_PILOT = re.compile(r"v(\d+)")
_SAFE = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class KeyHolder:
    """What a key names: a selection, a component, a pilot or a probe (the kinds of
    holder that submit a site job). ``ids`` are (selection,), (job, epoch, index) or
    (pilot,); a probe has
    ``site`` and ``token`` instead."""

    install: str
    kind: HolderKind
    ids: tuple[int, ...] = ()
    site: str | None = None
    token: str | None = None


def install_prefix(install: str) -> str:
    """The prefix every key of one state database starts with."""
    if not _INSTALL.fullmatch(install):
        raise ValueError(f"an install id is 12 lower-case hex digits, got {install!r}")
    return f"{KEY_PREFIX}{install}-"


def selection_key(install: str, selection_id: int) -> str:
    return f"{install_prefix(install)}s{selection_id}"


def component_key(install: str, job_id: int, epoch: int, index: int) -> str:
    return f"{install_prefix(install)}c{job_id}-{epoch}-{index}"


def probe_key(install: str, site: str, token: str) -> str:
    if not _SAFE.fullmatch(site):
        raise ValueError(f"site name {site!r} cannot be part of a submission key")
    if not re.fullmatch(r"[0-9a-f]+", token):
        raise ValueError(f"a probe token is lower-case hex digits, got {token!r}")
    return f"{install_prefix(install)}p{site}-{token}"


def pilot_key(install: str, pilot_id: int) -> str:
    return f"{install_prefix(install)}v{pilot_id}"


def is_valid_key(key: str) -> bool:
    """Whether ``key`` can name a site job (and a directory): safe characters only."""
    return len(key) <= KEY_MAX_LENGTH and _SAFE.fullmatch(key) is not None


def parse_key(key: str) -> KeyHolder | None:
    """The holder ``key`` names, or None for anything that is not one of our keys."""
    if not key.startswith(KEY_PREFIX) or len(key) > KEY_MAX_LENGTH:
        return None
    install, _, rest = key[len(KEY_PREFIX) :].partition("-")
    if not _INSTALL.fullmatch(install):
        return None
    if match := _SELECTION.fullmatch(rest):
        return KeyHolder(install, HolderKind.SELECTION, (int(match[1]),))
    if match := _COMPONENT.fullmatch(rest):
        ids = (int(match[1]), int(match[2]), int(match[3]))
        return KeyHolder(install, HolderKind.COMPONENT, ids)
    if match := _PROBE.fullmatch(rest):
        return KeyHolder(install, HolderKind.PROBE, site=match[1], token=match[2])
    if match := _PILOT.fullmatch(rest):
        return KeyHolder(install, HolderKind.PILOT, (int(match[1]),))
    return None
