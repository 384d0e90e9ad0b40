"""Every error gridcore raises derives from one root, :class:`GridError`.

Hierarchy::

    GridError
    +-- ConfigError          a grid description file is malformed (names file, path, field)
    +-- RequestError         a job request is impossible or malformed (names the field)
    +-- NoUsableSite         no site can run the job NOW: one that could is set aside as
                             unusable until its probe completes (wait, do not fail)
    +-- CredentialError      a credential reference cannot be resolved
    +-- StateError           the state database is missing, not migrated, or inconsistent
    +-- SiteError            a site adapter failed (carries the site name)
        +-- SiteUnavailable      the site cannot be reached (connection refused, timeout)
        |   +-- AnswerLost       the request went out, its answer did not come back: the
        |                        site may have carried it out (a submission is looked up)
        +-- SiteRejected         the site answered with an error (carries the site's message)
        +-- UnknownJob           the site does not know the job id
        +-- CredentialRejected   the site refused our credential, even renewed once
                                 (names the token reference, never the token)
    +-- StagingError         a file transfer failed (names source, destination and cause);
                             nothing was registered and no partial file is visible

Adapters translate library exceptions (requests, OSError) into these once, at the
boundary; everything above the adapters only ever sees GridError subclasses.
"""

from __future__ import annotations


class GridError(Exception):
    """Root of every error raised by gridcore."""


class ConfigError(GridError):
    """A grid description is malformed; the message names the offending field."""


class RequestError(GridError):
    """A job request is impossible or malformed; the message names the field."""


class NoUsableSite(GridError):
    """No site can take the job now, though a site that could run it is only set aside
    (marked unusable until a probe job completes there): a reason to wait and ask again,
    not a malformed request."""


class CredentialError(GridError):
    """A credential reference (env var or Airflow connection id) cannot be resolved."""


class StateError(GridError):
    """The state database is unusable (not migrated, unreachable, inconsistent)."""


class StagingError(GridError):
    """A staging transfer failed; the message names the source, the destination and the
    cause. Nothing was registered in the replica catalog and no partial file is left under
    a visible name."""


class SiteError(GridError):
    """A site adapter failed. ``site`` names the site; the message is the site's own."""

    def __init__(self, site: str, message: str) -> None:
        super().__init__(f"site {site}: {message}")
        self.site = site
        self.site_message = message


class SiteUnavailable(SiteError):
    """The site could not be reached at all."""


class AnswerLost(SiteUnavailable):
    """The request was sent and its answer lost: no answer within the timeout, or the
    connection dropped before the answer was read. The site may have carried it out,
    so a submission is never taken as not made: its key is looked up
    (:func:`gridcore.engine.submission.submit_once`). One lost answer says nothing of the
    site's health; the look-up that follows does."""


class SiteRejected(SiteError):
    """The site answered, with an error (for Slurm: the body's ``errors[]``)."""


class UnknownJob(SiteError):
    """The site has no record of the job id."""


class CredentialRejected(SiteError):
    """The site refused the credential (Slurm: HTTP 401/403/511 or error 1007), and again
    after it was read anew: a credential problem, not a dead site."""
