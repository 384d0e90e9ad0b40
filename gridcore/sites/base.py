"""The contract every site adapter fulfils. Adapters do I/O against ONE site and
translate every library error into a :mod:`gridcore.errors` type at this boundary."""

from __future__ import annotations

from typing import Protocol

from gridcore.model import JobResources, JobStatus, JobSubmission, SiteObservation, SiteSpec
from gridcore.sites.output import OutputFiles


class SiteAdapter(Protocol):
    """One site. Implementations: ``local.LocalSite``, ``slurm.SlurmSite``."""

    spec: SiteSpec

    @property
    def user(self) -> str | None:
        """The user this adapter's jobs run as at the site (``ObservedJob.user`` of the
        jobs it submits); ``None``: unknown."""
        ...

    def observe(self) -> SiteObservation:
        """Total and idle processors now, and the site's jobs (anyone's) with states.
        Each job carries the submission key it was submitted with (``ObservedJob.key``):
        this is the listing of our keyed jobs that orphan detection reads."""
        ...

    def submit(self, job: JobSubmission) -> str:
        """Start (or queue) the job; returns the site's job id as a string. A job is
        recorded by the site whole or not at all, and carries ``job.key`` if given."""
        ...

    def check_request(self, name: str, processors: int, resources: JobResources) -> None:
        """RequestError naming each field if the site could never run a job asking
        ``processors`` and ``resources`` (already over the site's defaults); nothing is
        submitted. The site's own limits (Slurm: its partitions and nodes) decide."""
        ...

    def find(self, key: str, since: float | None = None) -> str | None:
        """The id of the site's job submitted with ``key``, or None if the site has none.
        ``since`` (epoch seconds): no job with this key can be older (its holder's
        creation); a site that forgets finished jobs may then look it up in its records
        back to that time (Slurm: slurmdbd, past MinJobAge). None: what the site lists."""
        ...

    def status(self, job_id: str) -> JobStatus:
        """The job's state at the site. Raises UnknownJob if the site forgot it."""
        ...

    def cancel(self, job_id: str) -> None:
        """Cancel a pending or running job; cancelling a finished job is a no-op."""
        ...

    def output_files(self, job_id: str) -> OutputFiles:
        """Where the job's stdout and stderr go (paths on this machine, or URLs that
        :mod:`gridcore.sites.output` reads). Raises UnknownJob if the site forgot it."""
        ...
