"""A small batch-pipeline workload on a real local site with little storage, for the
live data-plan tests: origin files registered in the replica catalog, jobs that read
their batch volume and input and write a bounded output (and log each execution, so a
test can tell that no job ran twice), and a sampler of the bytes actually on the site's
disk."""

from __future__ import annotations

import random
import shlex
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gridcore.config import parse_grid
from gridcore.dataplan.format import BatchVolume, DepthSpec, PipelineInput, PipelineSpec
from gridcore.model import MB, ORIGIN, GridSpec
from gridcore.staging import ReplicaCatalog, register_source
from gridcore.state.store import Store, open_store

SITE = "alpha"
BATCH_BYTES = MB
INPUT_BYTES = 200_000
OUTPUT_BYTES = 150_000
VOLUME_DIRS = ("replicas", "dataplan")  # the site's volumes (jobs/ holds job logs)


@dataclass
class LiveSetup:
    base: Path
    grid: GridSpec
    store: Store
    catalog: ReplicaCatalog
    spec: PipelineSpec
    runs_log: Path

    @property
    def site_dir(self) -> Path:
        return self.base / SITE

    def executions(self) -> Counter[str]:
        """How many times each job ran (``pipeline/depth``), from the jobs' own log."""
        if not self.runs_log.exists():
            return Counter()
        return Counter(self.runs_log.read_text().split())


def grid_for(base: Path, storage_bytes: int, processors: int = 4) -> GridSpec:
    raw = {
        "version": 1,
        "sites": {
            SITE: {
                "kind": "local",
                "processors": processors,
                "storage_dir": str(base / SITE),
                "storage_gb": storage_bytes / 1e9,
            }
        },
        "bandwidth": {"origin": {SITE: 50.0}},
    }
    return parse_grid(raw, source="live-grid")


def setup(
    base: Path,
    *,
    storage_bytes: int = 4 * MB,
    W: int = 6,
    D: int = 2,
    job_s: float = 0.2,
    db_url: str | None = None,
) -> LiveSetup:
    """``W`` pipelines of ``D`` jobs; each job writes the first OUTPUT_BYTES of its batch
    volume and input, after ``job_s`` seconds."""
    grid = grid_for(base, storage_bytes)
    store = open_store(db_url or f"sqlite:///{base / 'state.db'}", upgrade=True)
    catalog = ReplicaCatalog(store)
    origin = base / "origin"
    origin.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    for d in range(D):
        f = origin / f"batch{d}.bin"
        f.write_bytes(rng.randbytes(BATCH_BYTES))
        register_source(catalog, f"live/batch{d}", ORIGIN, str(f))
    pipelines = []
    for p in range(W):
        f = origin / f"in{p}.bin"
        f.write_bytes(rng.randbytes(INPUT_BYTES))
        register_source(catalog, f"live/in{p}", ORIGIN, str(f))
        pipelines.append(PipelineInput(f"p{p}", INPUT_BYTES, logical_name=f"live/in{p}"))
    runs_log = base / "runs.log"
    log = shlex.quote(str(runs_log))
    command = (
        f"echo {{pipeline}}/{{depth}} >> {log}; sleep {job_s};"
        " cat {batch} {input} | head -c " + str(OUTPUT_BYTES) + " > {output}"
    )
    depths = tuple(
        DepthSpec(
            f"d{d}",
            command,
            job_s,
            OUTPUT_BYTES,
            batch=BatchVolume(f"live/batch{d}", BATCH_BYTES),
        )
        for d in range(D)
    )
    return LiveSetup(
        base, grid, store, catalog, PipelineSpec("live", depths, tuple(pipelines)), runs_log
    )


@dataclass
class DiskSampler:
    """Samples the bytes in the site's volume directories every ``every_s`` seconds
    (on the real file system, not the ledger) until stopped; ``peak`` is the largest."""

    site_dir: Path
    every_s: float = 0.01
    peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def measure(self) -> int:
        total = 0
        for name in VOLUME_DIRS:
            for path in (self.site_dir / name).rglob("*"):
                try:
                    if path.is_file():
                        total += path.stat().st_size
                except FileNotFoundError:
                    pass  # evicted while we looked
        return total

    def __enter__(self) -> DiskSampler:
        def loop() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, self.measure())
                self.samples += 1
                time.sleep(self.every_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


PYTHON = sys.executable
