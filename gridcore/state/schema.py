"""The state database schema (SQLAlchemy Core). Alembic migrations in ``migrations/``
create exactly these tables; a test checks that the migrated schema matches.

Ledger invariant (:func:`gridcore.state.capacity.check_invariant`, tested under
concurrency and faults): for every site, ``sites.claimed`` == the sum of
``holds.processors`` whose ``ledger`` is ``claimed``, ``sites.queued`` == the same for
``queued``, and ``sites.storage_claimed`` == the sum of the live holds' bytes. A claim
only takes processors that are free (``gridcore.state.capacity.FREE``) and bytes that
fit ``storage_total``, checked and applied in one conditional UPDATE.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

sites = Table(
    "gc_sites",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("total_processors", Integer, nullable=False),
    # what monitoring last reported (possibly stale)
    Column("reported_idle", Integer, nullable=False),
    Column("external_pending", Integer, nullable=False, default=0),
    Column("pending_jobs", Integer, nullable=False, default=0),
    Column("observed_at", Float, nullable=False, default=0.0),
    # our own in-flight processors not yet visible in the report: sums of gc_holds
    Column("claimed", Integer, nullable=False, default=0),
    Column("queued", Integer, nullable=False, default=0),
    # storage: the grid's limit (NULL = unlimited) and the bytes held by gc_holds
    Column("storage_total", BigInteger, nullable=True),
    Column("storage_claimed", BigInteger, nullable=False, default=0),
    # THE health of the site (gridcore.engine.health): consecutive errors of contact,
    # jobs and components; unusable at the threshold until a probe job completes
    Column("usable", Boolean, nullable=False, default=True),
    Column("consecutive_errors", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=True),
    Column("last_error_at", Float, nullable=True),  # when the last error was counted
    Column("probe_job_id", String(64), nullable=True),
    Column("probe_started_at", Float, nullable=True),
    # exponentially weighted observed queue wait / runtime of our finished jobs
    Column("mean_queue_wait_s", Float, nullable=True),
    Column("mean_runtime_s", Float, nullable=True),
    Column("finished_jobs", Integer, nullable=False, default=0),
    # what answers for the site: a Slurm release and the REST version in use (NULL: local
    # sites, or not observed yet)
    Column("release", String(64), nullable=True),
    Column("api_version", String(16), nullable=True),
    # the latest stored observation's queue as a wait model reads it (JSON; NULL: none
    # yet): gridcore.engine.wait_models.encode_queue
    Column("queue", Text, nullable=True),
)

# Which grid files define each site (gridcore.state.site_definitions): a site NAME is
# one site per state database (one gc_sites row, one ledger); every grid file that opens
# the database keeps here what it says the site is and when it last did, so a file that
# describes the site differently is refused, the storage limit in force is the smallest
# of the files in use, and a site no file in use defines is retired.
site_definitions = Table(
    "gc_site_definitions",
    metadata,
    Column("site", String(64), nullable=False),
    Column("source", Text, nullable=False),  # the grid file (GridSpec.source)
    # what the file says the site is: files in use must agree on these
    Column("kind", String(16), nullable=False),
    Column("processors", Integer, nullable=False),
    Column("url", Text, nullable=True),
    Column("partition", String(256), nullable=True),
    # the storage gridcore may use there (NULL = unlimited): files may differ
    Column("storage_total", BigInteger, nullable=True),
    Column("used_at", Float, nullable=False),  # the last time the file opened the database
    PrimaryKeyConstraint("site", "source", name="pk_gc_site_definitions"),
)

selections = Table(
    "gc_selections",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("stream", String(128), nullable=False),
    Column("name", String(256), nullable=False),
    Column("site", String(64), nullable=False),
    Column("processors", Integer, nullable=False),
    Column("protocol", String(32), nullable=False),  # SelectionProtocol (or "pinned")
    Column("mode", String(16), nullable=False),
    Column("outcome", String(8), nullable=False),  # fit | queue | pinned
    # its processors are a hold (kind "selection", holder = str(id)) in gc_holds
    Column("reasons", Text, nullable=False),  # JSON list of strings
    Column("state", String(16), nullable=False),  # gridcore.model.JobState
    Column("job_id", String(64), nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("message", Text, nullable=True),
    Column("selected_at", Float, nullable=False),
    Column("submitted_at", Float, nullable=True),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    # what the finished job used, from the site's accounting (JSON of JobUsage.as_json)
    Column("usage", Text, nullable=True),
    Index("ix_gc_selections_state", "state"),
)

local_jobs = Table(
    "gc_local_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("site", String(64), nullable=False),
    Column("name", String(256), nullable=False),
    Column("processors", Integer, nullable=False),
    Column("workdir", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("pid", Integer, nullable=True),
    Column("pgid", Integer, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("message", Text, nullable=True),
    Column("submitted_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    # the submission key (gridcore.sites.keys): one job per key, whoever submits it
    Column("key", String(128), nullable=True),
    # which start this is: the wrapper of attempt N runs only if it creates the fence
    # directory start.N first, so a start whose worker died can be fenced and redone
    Column("attempt", Integer, nullable=False, server_default="0"),
    Index("ix_gc_local_jobs_site_state", "site", "state"),
    UniqueConstraint("key", name="uq_gc_local_jobs_key"),
)

# -- this state database ----------------------------------------------------------------
# ``install_id``: 12 hex digits made once by migration 0007, part of every submission key,
# so that state databases sharing a cluster never take each other's jobs for their own.
meta = Table(
    "gc_meta",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

# -- replica catalog (gridcore.staging) ------------------------------------------------
# A row exists only for a complete, checksum-verified copy: transfers publish the file
# under its final name first and register it afterwards.
replicas = Table(
    "gc_replicas",
    metadata,
    Column("logical_name", String(512), nullable=False),
    Column("site", String(64), nullable=False),
    Column("url", Text, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("checksum", String(80), nullable=False),  # "sha256:<64 hex digits>"
    Column("registered_at", Float, nullable=False),
    PrimaryKeyConstraint("logical_name", "site", name="pk_gc_replicas"),
)

# Measured transfer rates between sites: an exponentially weighted mean (MB/s) that
# replaces the grid's bandwidth matrix in transfer-time estimates once sampled.
transfer_rates = Table(
    "gc_transfer_rates",
    metadata,
    Column("src", String(64), nullable=False),
    Column("dst", String(64), nullable=False),
    Column("mean_mbps", Float, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("updated_at", Float, nullable=False),
    PrimaryKeyConstraint("src", "dst", name="pk_gc_transfer_rates"),
)

# -- KOALA co-allocation (gridcore.engine.coallocation, gridcore.barrier) ---------------------
# A job is one row from submission to its end; ``epoch`` counts its placements, and its
# components (one row each, of the current epoch only) are replaced on every re-placement.
# A barrier or a site job of an older epoch matches no row and gives up.
coalloc_jobs = Table(
    "gc_coalloc_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(256), nullable=False),
    Column("request", Text, nullable=False),  # JSON of the CoAllocationRequest
    Column("command", Text, nullable=False),
    Column("policy", String(8), nullable=False),
    Column("quota", Float, nullable=True),
    Column("priority", String(8), nullable=False),
    # queued | placed | claiming | running | completed | failed | cancelled
    Column("state", String(16), nullable=False),
    Column("epoch", Integer, nullable=False, default=0),
    Column("placement_tries", Integer, nullable=False, default=0),
    Column("claim_tries", Integer, nullable=False, default=0),
    Column("L", Float, nullable=False),
    Column("jpt", Float, nullable=True),
    Column("ftt", Float, nullable=True),
    Column("jst", Float, nullable=True),
    Column("jct", Float, nullable=True),
    Column("placement", Text, nullable=True),  # JSON: policy, components, reasons
    Column("submitted_at", Float, nullable=False),
    Column("placed_at", Float, nullable=True),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Column("message", Text, nullable=True),
    Column("retries", Integer, nullable=False, default=0),
    # unexpected errors while handling the job (any epoch); it fails at a bound
    # (gridcore.engine.scan.MAX_HANDLING_ERRORS) instead of stopping every scan
    Column("handling_errors", Integer, nullable=False, default=0, server_default="0"),
    Index("ix_gc_coalloc_jobs_state", "state"),
)

coalloc_components = Table(
    "gc_coalloc_components",
    metadata,
    Column("job_id", Integer, nullable=False),
    Column("idx", Integer, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("size", Integer, nullable=False),
    Column("site", String(64), nullable=False),
    Column("file_site", String(64), nullable=True),
    Column("transfer_s", Float, nullable=False),
    # placed | submitting | submitted | completed | failed | aborted
    Column("state", String(16), nullable=False),
    Column("site_job_id", String(64), nullable=True),
    Column("claimed_at", Float, nullable=True),
    Column("registered_at", Float, nullable=True),
    Column("released_at", Float, nullable=True),  # passed the start barrier
    Column("finished_at", Float, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("host", String(255), nullable=True),
    Column("port", Integer, nullable=True),
    Column("message", Text, nullable=True),
    # sha256 of the component's bearer token for the start barrier on the HTTP API
    Column("token_hash", String(128), nullable=True),
    PrimaryKeyConstraint("job_id", "idx", name="pk_gc_coalloc_components"),
)

# -- the capacity ledger (gridcore.state.capacity) ------------------------------------
# Every holder of processors or storage bytes at a site is one row: a selection, a
# co-allocation component, a probe job, a staged volume, a pilot. ``ledger`` says where
# its processors count (claimed | queued) and is NULL once released (exactly once).
# ``site_job_id``: the site job whose appearance (running/finished) in an observation
# releases the hold, as the report then counts those processors itself.
holds = Table(
    "gc_holds",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("site", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # capacity.HolderKind
    Column("holder", String(512), nullable=False),
    Column("processors", Integer, nullable=False, default=0),
    Column("storage_bytes", BigInteger, nullable=False, default=0),
    Column("ledger", String(8), nullable=True),  # capacity.Ledger | NULL (released)
    Column("site_job_id", String(64), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("released_at", Float, nullable=True),
    UniqueConstraint("kind", "holder", name="uq_gc_holds_kind_holder"),
    Index("ix_gc_holds_site_ledger", "site", "ledger"),
)

# Named leases: one holder at a time (the KOALA queue scanner); ``scans`` counts the scans
# made under the lease (it drives the high/low placement-queue cycle).
leases = Table(
    "gc_leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(256), nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("scans", Integer, nullable=False, default=0),
    # fencing token: grows whenever the lease is taken anew (free, expired, or another's);
    # a holder's writes commit only while the row still has the token it took
    Column("token", Integer, nullable=False, default=0, server_default="0"),
)

# -- VJM co-reservation (gridcore.engine.coreservation, gridcore.api) -------------------
# A co-reserved job is one row; its pilots (virtual jobs) are rows of gc_pilots whose
# ``job_id`` is the job that owns them NOW (a reorganization shifts held pilots to another
# job by rewriting it). A pilot is also a holder (kind "pilot", holder = str(id)) in the
# capacity ledger until the site's report counts its processors.
reservations = Table(
    "gc_reservations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(256), nullable=False),
    Column("command", Text, nullable=False),
    Column("processors", Integer, nullable=False),
    Column("vj_size", Integer, nullable=False),  # g: processors per virtual job
    Column("max_clusters", Integer, nullable=False),  # M
    Column("lifetime_floor_s", Float, nullable=False),
    Column("workdir", Text, nullable=True),
    Column("state", String(16), nullable=False),  # engine.phases.ReservationPhase
    Column("submitted_at", Float, nullable=False),
    Column("lifetime_s", Float, nullable=True),  # Eq. 2 of the current selection
    Column("deadline_at", Float, nullable=True),  # when the lifetime runs out
    Column("selection", Text, nullable=True),  # JSON: choices, reasons (latest selection)
    Column("held_at", Float, nullable=True),  # every pilot held (co-allocation time)
    Column("dispatched_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Column("message", Text, nullable=True),
    Column("reorganizations", Integer, nullable=False, default=0, server_default="0"),
    Column("substitutes", Integer, nullable=False, default=0, server_default="0"),
    Column("handling_errors", Integer, nullable=False, default=0, server_default="0"),
    Index("ix_gc_reservations_state", "state"),
)

pilots = Table(
    "gc_pilots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, nullable=False),  # the reservation that owns it now
    Column("first_job_id", Integer, nullable=False),  # the reservation it was sent for
    Column("site", String(64), nullable=False),
    Column("processors", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # engine.phases.PilotState
    Column("key", String(128), nullable=False),  # submission key (gridcore.sites.keys)
    Column("token_hash", String(128), nullable=False),  # sha256 of its bearer token
    Column("site_job_id", String(64), nullable=True),
    Column("t_avail", Float, nullable=True),  # Eq. 1 when it was selected
    Column("submitted_at", Float, nullable=False),
    Column("registered_at", Float, nullable=True),  # started: holds its processors
    Column("heartbeat_at", Float, nullable=True),
    Column("host", String(255), nullable=True),
    Column("port", Integer, nullable=True),
    Column("component", Integer, nullable=True),  # its rank in the dispatched command
    Column("dispatched_at", Float, nullable=True),
    Column("started_at", Float, nullable=True),  # the real command started in it
    Column("finished_at", Float, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("message", Text, nullable=True),
    Index("ix_gc_pilots_job_state", "job_id", "state"),
    UniqueConstraint("key", name="uq_gc_pilots_key"),
)

# Every shift of held pilots between jobs (Sec. 3.3 steps 1-2) and every release of a
# job's clusters (step 3, lost pilots): a row a person can read.
reservation_shifts = Table(
    "gc_reservation_shifts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("step", String(32), nullable=False),  # indirect (Eq. 3) | direct (Eq. 4) | ...
    Column("from_job", Integer, nullable=False),
    Column("to_job", Integer, nullable=True),  # NULL: released, not shifted
    Column("site", String(64), nullable=False),
    Column("pilot_id", Integer, nullable=True),
    Column("reason", Text, nullable=False),
)

# Queue-wait history per site for VJM Eq. 1 (gridcore.engine.queue_stats): every job a
# site showed (others' and our pilots), when it was submitted and when it started; and
# what the wait models learn from (gridcore.engine.wait_models): its size, user, time
# limit and, once seen finished, its end.
queue_waits = Table(
    "gc_queue_waits",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("site", String(64), nullable=False),
    Column("site_job_id", String(64), nullable=False),
    Column("external", Boolean, nullable=False),  # True: not one of ours
    Column("submitted_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),  # NULL while it waits
    Column("seen_at", Float, nullable=False),  # the last observation that showed it
    Column("processors", Integer, nullable=True),  # NULL: rows older than 0014
    Column("owner", String(128), nullable=True),  # the job's user; NULL: unknown
    Column("time_limit_s", Float, nullable=True),  # NULL: unknown or unlimited
    Column("ended_at", Float, nullable=True),  # NULL: not seen finished
    # a wait model's forecast of its wait, made at forecast_at (0015); NULL: none made
    Column("forecast_s", Float, nullable=True),
    Column("forecast_at", Float, nullable=True),
    Column("forecast_by", String(64), nullable=True),  # the model's name
    UniqueConstraint("site", "site_job_id", name="uq_gc_queue_waits_site_job"),
    Index("ix_gc_queue_waits_site_started", "site", "started_at"),
)

# The Grid page's logins under ``gridcore serve`` (gridcore.api.sessions): the cookie
# holds a random session id, this table its hash, so logging out or expiring ends it
# and the operator's token never leaves the login form.
dashboard_sessions = Table(
    "gc_dashboard_sessions",
    metadata,
    Column("id_hash", String(64), primary_key=True),  # sha256 hex of the cookie's value
    # which operator token opened it (a short digest of its hash): a new token ends it
    Column("operator", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)
