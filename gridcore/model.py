"""Frozen value types shared by policies, engines, adapters and the simulator.

Nothing here does I/O. Policies receive these snapshots and return decisions; engines
and adapters build them from live state.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

# Transfers and sizes use decimal megabytes, as bandwidths are given in MB/s.
MB = 1_000_000


class SiteKind(enum.StrEnum):
    LOCAL = "local"
    SLURM = "slurm"


@dataclass(frozen=True)
class CredentialRef:
    """A credential named, never embedded: an env var, an Airflow connection id (its
    password), a file (read again when it changes) or a command (run again before the
    JWT it prints expires). Exactly one is set."""

    env: str | None = None
    airflow_conn: str | None = None
    file: str | None = None
    command: str | None = None

    def describe(self) -> str:
        if self.env:
            return f"env:{self.env}"
        if self.file:
            return f"file:{self.file}"
        if self.command:
            return f"command:{self.command}"
        return f"airflow_conn:{self.airflow_conn}"


class MemoryScope(enum.StrEnum):
    """What a job's ``memory`` is counted per (Slurm's --mem / --mem-per-cpu)."""

    NODE = "node"
    CPU = "cpu"


@dataclass(frozen=True)
class JobResources:
    """What a cluster asks of a job besides its processors. None / 0 means "not asked":
    the site's defaults (grid file) fill it, else the cluster's own defaults apply.
    Memory is in MiB (Slurm's M), time in whole seconds (Slurm gets minutes, rounded up).
    """

    time_limit_s: int | None = None
    account: str | None = None
    qos: str | None = None
    partition: str | None = None
    memory_mib: int | None = None
    memory_per: MemoryScope = MemoryScope.NODE
    gpus: int | None = None  # 0 asks for none, also where the site's default asks some
    constraint: str | None = None

    def over(self, defaults: JobResources) -> JobResources:
        """These resources with every unset field taken from ``defaults``."""
        memory_set = self.memory_mib is not None
        return JobResources(
            time_limit_s=self.time_limit_s
            if self.time_limit_s is not None
            else defaults.time_limit_s,
            account=self.account if self.account is not None else defaults.account,
            qos=self.qos if self.qos is not None else defaults.qos,
            partition=self.partition if self.partition is not None else defaults.partition,
            memory_mib=self.memory_mib if memory_set else defaults.memory_mib,
            memory_per=self.memory_per if memory_set else defaults.memory_per,
            gpus=self.gpus if self.gpus is not None else defaults.gpus,
            constraint=self.constraint if self.constraint is not None else defaults.constraint,
        )

    @property
    def is_empty(self) -> bool:
        """Nothing asked: every field unset."""
        return self == NO_RESOURCES

    def as_json(self) -> dict[str, object]:
        """The fields that are set, as plain JSON (XCom, ``--json``, the state database's
        JSON columns); :meth:`from_json` inverts it."""
        out: dict[str, object] = {}
        for key in ("time_limit_s", "account", "qos", "partition", "constraint"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.memory_mib is not None:
            out["memory_mib"] = self.memory_mib
            out["memory_per"] = self.memory_per.value
        if self.gpus is not None:
            out["gpus"] = self.gpus
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object] | None) -> JobResources:
        """The resources :meth:`as_json` wrote (None or ``{}``: nothing asked). Stored
        values only: user input is checked by ``gridcore.validation.check_resources``."""
        if not data:
            return NO_RESOURCES

        def text(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        def number(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else int(str(value))

        return cls(
            time_limit_s=number("time_limit_s"),
            account=text("account"),
            qos=text("qos"),
            partition=text("partition"),
            memory_mib=number("memory_mib"),
            memory_per=MemoryScope(str(data.get("memory_per", MemoryScope.NODE.value))),
            gpus=number("gpus"),
            constraint=text("constraint"),
        )


NO_RESOURCES = JobResources()


@dataclass(frozen=True)
class SiteSpec:
    """One site of the grid description (see ``gridcore/config.py`` for the format)."""

    name: str
    kind: SiteKind
    processors: int
    slowness: float = 1.0
    storage_dir: str | None = None
    storage_bytes: int | None = None
    # slurm only
    url: str | None = None
    partition: str | None = None
    user: str | None = None
    token: CredentialRef | None = None
    # "auto": the newest version both slurmrestd and gridcore speak (GET /openapi/v3)
    api_version: str = "auto"
    timeout_s: float = 10.0
    # what every job on this site asks for unless its request says otherwise
    defaults: JobResources = NO_RESOURCES


ORIGIN = "origin"
"""Pseudo-site name for the host that holds a job's inputs and receives its outputs."""


@dataclass(frozen=True)
class GridSpec:
    """A validated grid: sites and the directed bandwidth matrix in MB/s."""

    sites: tuple[SiteSpec, ...]
    bandwidth_mbps: Mapping[tuple[str, str], float] = field(
        default_factory=lambda: MappingProxyType({})
    )
    default_bandwidth_mbps: float = 100.0
    source: str = "<memory>"

    def site(self, name: str) -> SiteSpec:
        for spec in self.sites:
            if spec.name == name:
                return spec
        from gridcore.errors import ConfigError

        known = ", ".join(s.name for s in self.sites)
        raise ConfigError(f"unknown site {name!r} (grid {self.source} has: {known})")

    @functools.cached_property
    def slowness_by_site(self) -> Mapping[str, float]:
        return MappingProxyType({s.name: s.slowness for s in self.sites})

    @property
    def site_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sites)

    def bandwidth(self, src: str, dst: str) -> float:
        """MB/s from ``src`` to ``dst``; a missing pair falls back to the reverse, then
        to ``default_bandwidth_mbps``. A site to itself is treated as free (infinite)."""
        if src == dst:
            return float("inf")
        found = self.bandwidth_mbps.get((src, dst))
        if found is None:
            found = self.bandwidth_mbps.get((dst, src), self.default_bandwidth_mbps)
        return found


class JobState(enum.StrEnum):
    SELECTED = "selected"  # a site was chosen, nothing submitted yet
    PENDING = "pending"  # submitted, queued at the site
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


UNFINISHED_STATES = tuple(state.value for state in JobState if not state.finished)
"""The stored values of the states a selection has not ended in (for ``IN (...)``)."""


@dataclass(frozen=True)
class ObservedJob:
    """A job as a site reports it (ours or anyone's)."""

    job_id: str
    processors: int
    state: JobState
    # the submission key the job carries (gridcore.sites.keys), None for others' jobs
    key: str | None = None
    # epoch seconds as the site reports them (None: not reported, or not started yet);
    # the queue-wait history of VJM Eq. 1 is built from them (gridcore.engine.queue_stats)
    submitted_at: float | None = None
    started_at: float | None = None
    # what a wait model reads (gridcore.policies.wait_prediction, docs/wait-prediction.md):
    # the job's owner and time limit (None: unknown, unlimited); when it ended (finished
    # jobs the site still shows); and the site scheduler's own forecast of a PENDING
    # job's start (Slurm's backfill plan, ``start_time`` of a pending job), None otherwise
    user: str | None = None
    time_limit_s: float | None = None
    ended_at: float | None = None
    start_estimate: float | None = None
    # the job's name as submitted (None: not reported); what finds a keyless job, as a
    # replayed one (``gcreplay-<run>-<n>``, gridcore.engine.replay), by its site id
    name: str | None = None


@dataclass(frozen=True)
class SiteObservation:
    """What one site reports right now: capacity, idle processors, its queue."""

    site: str
    total_processors: int
    idle_processors: int
    jobs: tuple[ObservedJob, ...] = ()
    observed_at: float = 0.0
    # Slurm sites: the release answering and the REST version the adapter speaks to it
    release: str | None = None
    api_version: str | None = None

    def pending(self) -> tuple[ObservedJob, ...]:
        return tuple(j for j in self.jobs if j.state is JobState.PENDING)


@dataclass(frozen=True)
class SiteSnapshot:
    """A policy's view of one site's processors, taken once per decision. Both kinds of
    policy read it: site selection (``gridcore/policies/selection.py``) and KOALA
    placement and claiming (``gridcore/policies/placement.py``, ``claiming.py``).

    ``total_processors``: the site's size.
    ``idle_processors``: the idle processors monitoring reported (possibly stale). A
    snapshot built from an already exact count (a simulator's cluster, a whole idle grid)
    puts that count here and leaves the next two fields 0. A decision that takes
    processors from a snapshot it carries on (a placement scan) lowers this field by
    what it took (:meth:`take`).
    ``in_flight_processors``: processors of OUR work the report does not show yet
    (selections selected or submitted and not yet seen running; in the KOALA engine
    every hold in the capacity ledger, claimed or queued, but the deciding job's own).
    ``external_pending_processors``: other users' queued jobs, which come first.
    :attr:`free_processors` combines the three: what a decision may use.

    Selection only: ``slowness``, ``pending_jobs``, ``usable`` (KOALA leaves unusable
    sites out of its snapshots instead) with ``unusable_because`` (why, in words: its
    errors, the last one and when; :func:`gridcore.engine.health.set_aside_because`),
    and the observed ``mean_queue_wait_s`` and ``mean_runtime_s`` that feed the
    ``earliest`` mode.
    """

    site: str
    total_processors: int
    idle_processors: int
    slowness: float = 1.0
    in_flight_processors: int = 0
    external_pending_processors: int = 0
    pending_jobs: int = 0
    usable: bool = True
    mean_queue_wait_s: float | None = None
    mean_runtime_s: float | None = None
    unusable_because: str = ""

    # Cached (the snapshot is frozen): placement reads it per site, on every decision.
    @functools.cached_property
    def free_processors(self) -> int:
        """The processors a decision may use: reported idle minus ours in flight minus
        others' queued work (Protocol 1's stateful branch; KOALA's idle processors). The
        one place this is computed in Python; the ledger's SQL twin is
        ``gridcore.state.capacity.FREE``. May be negative."""
        return self.idle_processors - self.in_flight_processors - self.external_pending_processors

    def add_in_flight(self, processors: int) -> SiteSnapshot:
        """This snapshot after a decision sent ``processors`` more of ours to the site
        (a burst decided on one snapshot, :func:`gridcore.policies.selection.select_sites`).
        Built field by field: ``dataclasses.replace`` cost as much as the estimate."""
        return SiteSnapshot(
            self.site, self.total_processors, self.idle_processors, self.slowness,
            self.in_flight_processors + processors, self.external_pending_processors,
            self.pending_jobs, self.usable, self.mean_queue_wait_s, self.mean_runtime_s,
        )  # fmt: skip

    def take(self, processors: int) -> SiteSnapshot:
        """This snapshot after a decision took ``processors`` (negative: gave them back,
        as a preemption does): :attr:`free_processors` changes by exactly that much."""
        return replace(self, idle_processors=self.idle_processors - processors)


ASSUMED_RUNTIME_S = 600.0
"""A job's runtime on a reference site when its request gives none and the site has no
history of finished jobs: an estimate reports it as assumed (:class:`RuntimeBasis`)."""


@dataclass(frozen=True)
class JobRequest:
    """One job to place on one site (an ensemble member). ``runtime_s``: its runtime on a
    reference site, seconds; None when nobody knows it (the selection policy then
    estimates it from the site's history, else assumes :data:`ASSUMED_RUNTIME_S`)."""

    name: str
    processors: int
    runtime_s: float | None = None
    input_bytes: int = 0
    output_bytes: int = 0
    origin: str = ORIGIN

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything but the name: what a policy's estimate for this request reads."""
        return (self.processors, self.runtime_s, self.input_bytes, self.output_bytes, self.origin)


@dataclass(frozen=True)
class JobSubmission:
    """What an adapter needs to start a job at its site."""

    name: str
    command: str
    processors: int
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # unique per holder (gridcore.sites.keys): a site that has a job with this key
    # returns it instead of starting a second one; None submits without a key
    key: str | None = None
    # time limit, account, memory, GPUs...; the site's defaults fill what is unset
    resources: JobResources = NO_RESOURCES


@dataclass(frozen=True)
class JobUsage:
    """What a finished job used, from the site's accounting (Slurm: slurmdbd)."""

    elapsed_s: float
    cpu_time_s: float
    cpus: int
    max_rss_bytes: int | None = None

    @property
    def cpu_efficiency(self) -> float | None:
        """CPU time / (elapsed x CPUs), as Slurm's ``seff`` reports it."""
        wall = self.elapsed_s * self.cpus
        return self.cpu_time_s / wall if wall > 0 else None

    def as_json(self) -> dict[str, object]:
        return {
            "elapsed_s": self.elapsed_s,
            "cpu_time_s": self.cpu_time_s,
            "cpus": self.cpus,
            "max_rss_bytes": self.max_rss_bytes,
            "cpu_efficiency": self.cpu_efficiency,
        }


@dataclass(frozen=True)
class JobStatus:
    """A job's state at its site; times are epoch seconds when known.

    A job the site put back in its queue (requeued after a node failure or preemption)
    is PENDING with ``requeued_by`` naming why; a held job is PENDING with ``held``."""

    job_id: str
    state: JobState
    exit_code: int | None = None
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    reason: str = ""
    held: bool = False
    requeued_by: str | None = None
    restarts: int = 0
    usage: JobUsage | None = None


class Outcome(enum.IntEnum):
    """Ordered: a decision with a higher outcome is better. NO_FIT < QUEUE < FIT."""

    NO_FIT = 0  # no usable site at all
    QUEUE = 1  # no site has room: sent to a full site to queue (random/best/earliest)
    FIT = 2  # a site has enough effective idle processors

    @property
    def label(self) -> str:
        """The outcome as the state database stores it (``gc_selections.outcome``)."""
        return self.name.lower()


class RuntimeBasis(enum.StrEnum):
    """Where an estimate's runtime at a site comes from."""

    GIVEN = "given"  # the request's runtime_s x the site's slowness
    HISTORY = "history"  # the mean runtime of the jobs that finished there
    ASSUMED = "assumed"  # nothing known: ASSUMED_RUNTIME_S x the site's slowness


@dataclass(frozen=True)
class SiteEstimate:
    """The policy's estimate for one site; ``reason`` renders it for people."""

    site: str
    effective_idle: int
    fits: bool
    transfer_s: float
    compute_s: float
    queue_delay_s: float
    completion_s: float
    needed: int = 0
    reported_idle: int = 0
    in_flight: int = 0
    others_queued: int = 0
    runtime_basis: RuntimeBasis = RuntimeBasis.GIVEN

    @property
    def reason(self) -> str:
        # Rendered on demand: a decision over 100 sites needs only one or two of these.
        relation = ">=" if self.fits else "<"
        wait = f", estimated queue delay {self.queue_delay_s:.0f} s" if self.queue_delay_s else ""
        return (
            f"site {self.site}: {self.effective_idle} idle {relation} {self.needed} needed"
            f" (reported {self.reported_idle}, ours in flight {self.in_flight},"
            f" others queued {self.others_queued}){wait}; est. completion {self.completion_s:.0f} s"
            f"{self._runtime_note}"
        )

    @property
    def _runtime_note(self) -> str:
        if self.runtime_basis is RuntimeBasis.HISTORY:
            return f", runtime {self.compute_s:.0f} s from the site's history"
        if self.runtime_basis is RuntimeBasis.ASSUMED:
            return f", runtime unknown ({ASSUMED_RUNTIME_S:.0f} s assumed)"
        return ""


@dataclass(frozen=True)
class SiteSelection:
    """A selection decision: where, how sure, and why."""

    site: str | None
    outcome: Outcome
    protocol: str
    mode: str
    reasons: tuple[str, ...]
    estimates: tuple[SiteEstimate, ...] = ()

    def estimate_for(self, site: str) -> SiteEstimate | None:
        for est in self.estimates:
            if est.site == site:
                return est
        return None


# -- co-allocation (KOALA: KOALA 2005 Sec. 2.3-2.4, KOALA 2006 Sec. 2.2) -------------------


class RequestKind(enum.StrEnum):
    """KOALA 2006 Sec. 2.2: the three request structures."""

    FIXED = "fixed"  # component sizes AND their execution sites
    NON_FIXED = "non-fixed"  # component sizes; the scheduler picks sites
    FLEXIBLE = "flexible"  # only a total; the scheduler splits it


class Priority(enum.StrEnum):
    HIGH = "high"
    LOW = "low"


class FileDelivery(enum.StrEnum):
    """KOALA 2005 Sec. 2.3: the two file-distribution models."""

    WHOLE = "whole"  # every component reads the whole file
    CHUNKED = "chunked"  # each component reads its share of the file


@dataclass(frozen=True)
class Component:
    """One job component: its processors and, for fixed requests only, its site."""

    size: int
    site: str | None = None


@dataclass(frozen=True)
class FlexibleOptions:
    """Restrictions a flexible request may impose (KOALA 2006 Sec. 2.2): a lower bound on
    component size (default 1), an upper bound on the number of components (default:
    the number of sites), and an ordered list of allowed splits, most preferred first."""

    min_component_size: int = 1
    max_components: int | None = None
    splits: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class InputFile:
    """The job's single input file, by logical name (resolved by the replica catalog)."""

    logical_name: str
    delivery: FileDelivery = FileDelivery.WHOLE


@dataclass(frozen=True)
class CoAllocationRequest:
    """A parallel job whose components must run at the same time, possibly on several
    sites. ``components`` for fixed and non-fixed requests; ``total`` for flexible ones."""

    name: str
    kind: RequestKind
    components: tuple[Component, ...] = ()
    total: int = 0
    input_file: InputFile | None = None
    priority: Priority = Priority.LOW
    flexible: FlexibleOptions = field(default_factory=FlexibleOptions)
    # what every component asks of its site (each component's site fills what is unset)
    resources: JobResources = NO_RESOURCES

    @property
    def processors(self) -> int:
        if self.kind is RequestKind.FLEXIBLE:
            return self.total
        return sum(c.size for c in self.components)


def component_job_name(name: str, index: int) -> str:
    """The name of component ``index`` of co-allocated job ``name`` (its site job, its
    holder in the simulator, its single-component re-placement)."""
    return f"{name}#{index}"


@dataclass(frozen=True)
class Replica:
    """A complete, checksum-verified copy of a logical file at a site."""

    logical_name: str
    site: str
    url: str
    size_bytes: int
    checksum: str


@dataclass(frozen=True)
class PlacedComponent:
    """A component with its execution site and, when the job has an input file, the
    site it gets the file from and the estimated transfer time (0 if already there)."""

    index: int
    size: int
    site: str
    file_site: str | None = None
    transfer_s: float = 0.0


@dataclass(frozen=True)
class Placement:
    """A placement decision: FIT with components, or NO_FIT with reasons (the job goes
    to a placement queue). ``policy`` names the policy that decided."""

    request: str
    policy: str
    outcome: Outcome
    components: tuple[PlacedComponent, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def clusters_combined(self) -> int:
        return len({c.site for c in self.components})

    @property
    def file_transfer_s(self) -> float:
        """FTT (KOALA 2005 Sec. 3.2): the longest of the components' transfer times."""
        return max((c.transfer_s for c in self.components), default=0.0)


@dataclass(frozen=True)
class SiteHealth:
    """A site's consecutive errors, and whether KOALA still places jobs there (KOALA 2005
    Sec. 3.4). The live engine stores it (``gridcore.engine.health``), the simulator
    keeps it in memory, and the claiming policy takes it as input."""

    site: str
    consecutive_errors: int = 0
    usable: bool = True


class HolderKind(enum.StrEnum):
    """What holds capacity of a site: the ``kind`` of a capacity-ledger hold row
    (``gridcore/state/capacity.py``) and of the holder a submission key names
    (``gridcore/sites/keys.py``; pilots and volumes submit no site job, so have no key)."""

    SELECTION = "selection"  # holder: the selection id
    COMPONENT = "component"  # holder: "job:epoch:idx" (state.capacity.component_holder)
    PILOT = "pilot"  # holder: the pilot id
    VOLUME = "volume"  # holder: "logical_name@site" (state.capacity.volume_holder)
    PROBE = "probe"  # holder: "site:<unique>"


@dataclass(frozen=True)
class CoReservationRequest:
    """A parallel job co-reserved through pilots (VJM): ``processors`` in all, in
    virtual jobs of ``vj_size`` processors (g), over at most ``max_clusters`` clusters
    (M); ``lifetime_floor_s`` bounds Eq. 2's lifetime from below; ``sites`` limits the
    candidate clusters (None: every site of the grid); ``machine_file`` pins how many
    virtual jobs go to which site (MPICH-G2's static file) instead. Checked by
    ``gridcore.validation.check_coreservation_request``."""

    name: str
    command: str
    processors: int
    vj_size: int = 1
    max_clusters: int = 4
    lifetime_floor_s: float = 60.0
    workdir: str | None = None
    sites: tuple[str, ...] | None = None
    # a static machine file: (site, virtual jobs) pinned instead of selected (Eq. 1)
    machine_file: tuple[tuple[str, int], ...] | None = None
    # what the command asks of each cluster; ``time_limit_s`` is the command's own: each
    # pilot asks for its reservation's lifetime more (gridcore.engine.coreservation)
    resources: JobResources = NO_RESOURCES

    @property
    def virtual_jobs(self) -> int:
        return self.processors // self.vj_size
