"""Transfer time: the one bandwidth type, the one seconds formula, the best replica.

Every policy and model that estimates moving bytes between sites uses these: site
selection (RENCI TR-08-02 Protocol 1, "estimate total time on this resource"), KOALA's
Close-to-Files placement and claiming (KOALA 2005 Sec. 2.3, 2.6), the staging catalog and
the simulators. Rates are decimal MB/s (``gridcore.model.MB``), as in the grid file.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from gridcore.errors import ConfigError, RequestError
from gridcore.model import MB, CoAllocationRequest, FileDelivery, JobRequest, Replica

Bandwidth = Callable[[str, str], float]
"""``(source site, destination site) -> MB/s``; ``inf`` means free, ``<= 0`` no link."""


def transfer_seconds(size_bytes: int, mb_per_s: float) -> float:
    """Seconds to move ``size_bytes`` at ``mb_per_s``: 0 when there is nothing to move or
    the rate is infinite (within a site), ``inf`` when there is no link (rate <= 0)."""
    if size_bytes <= 0:
        return 0.0
    if not mb_per_s > 0:
        return math.inf
    return size_bytes / MB / mb_per_s


def link_seconds(size_bytes: int, src: str, dst: str, bandwidth: Bandwidth) -> float:
    """Seconds to move ``size_bytes`` from ``src`` to ``dst``; free within one site."""
    if src == dst:
        return 0.0
    return transfer_seconds(size_bytes, bandwidth(src, dst))


def job_transfer_seconds(request: JobRequest, site: str, bandwidth: Bandwidth) -> float:
    """A selected job's upload of its inputs from its origin and download of its outputs
    back (RENCI TR-08-02 Protocol 1)."""
    return transfer_seconds(request.input_bytes, bandwidth(request.origin, site)) + (
        transfer_seconds(request.output_bytes, bandwidth(site, request.origin))
    )


def component_bytes(request: CoAllocationRequest, replica: Replica, component_size: int) -> int:
    """Bytes a component reads from ``replica`` (KOALA 2005 Sec. 2.3): the whole file, or
    its share of a chunked file (rounded up)."""
    if request.input_file is not None and request.input_file.delivery is FileDelivery.CHUNKED:
        return -(-replica.size_bytes * component_size // request.processors)
    return replica.size_bytes


def component_transfer_seconds(
    request: CoAllocationRequest,
    component_size: int,
    replica: Replica | None,
    site: str,
    bandwidth: Bandwidth | None,
) -> float:
    """Estimated seconds to bring a component's input from ``replica`` to ``site``.
    Without an input file nothing moves (0 s); an input file without a source never
    arrives (``inf``)."""
    if replica is None:
        return 0.0 if request.input_file is None else math.inf
    if replica.site == site:
        return 0.0
    if bandwidth is None:
        raise RequestError(
            f"bandwidth: needed to estimate moving {replica.logical_name}"
            f" from {replica.site} to {site}"
        )
    return link_seconds(
        component_bytes(request, replica, component_size), replica.site, site, bandwidth
    )


def best_replica(
    request: CoAllocationRequest,
    component_size: int,
    site: str,
    replicas: Sequence[Replica],
    bandwidth: Bandwidth | None,
) -> tuple[Replica | None, float]:
    """The replica of the request's input file that reaches ``site`` soonest, and the
    seconds it takes. A replica at ``site`` itself wins; otherwise the first listed of the
    fastest. ``(None, 0.0)`` without an input file, ``(None, inf)`` without a replica."""
    if request.input_file is None:
        return None, 0.0
    name = request.input_file.logical_name
    files = [r for r in replicas if r.logical_name == name]
    for replica in files:
        if replica.site == site:
            return replica, 0.0
    best: Replica | None = None
    best_s = math.inf
    for replica in files:
        seconds = component_transfer_seconds(request, component_size, replica, site, bandwidth)
        if best is None or seconds < best_s:
            best, best_s = replica, seconds
    return best, best_s


def uniform_bandwidth(mb_per_s: float) -> Bandwidth:
    """One rate between any two sites, and none needed within one (a replica at the
    execution site costs 0 s)."""
    if not mb_per_s > 0:
        raise ConfigError(f"bandwidth must be > 0 MB/s, got {mb_per_s}")

    def bandwidth(src: str, dst: str) -> float:
        return math.inf if src == dst else mb_per_s

    return bandwidth


def free_bandwidth(src: str, dst: str) -> float:
    """Every transfer takes no time (a model that counts transfers elsewhere)."""
    return math.inf
