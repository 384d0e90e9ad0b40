"""Every error gridcore raises derives from one root, :class:`GridError`.

Hierarchy::

    GridError
    +-- ConfigError          a grid description file is malformed (names file, path, field)
    +-- RequestError         a job request is impossible or malformed (names the field)
    +-- CredentialError      a credential reference cannot be resolved
    +-- StateError           the state database is missing, not migrated, or inconsistent
    +-- SiteError            a site adapter failed (carries the site name)
        +-- SiteUnavailable      the site cannot be reached (connection refused, timeout)
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


class SiteRejected(SiteError):
    """The site answered, with an error (for Slurm: the body's ``errors[]``)."""


class UnknownJob(SiteError):
    """The site has no record of the job id."""


class CredentialRejected(SiteError):
    """The site refused the credential (Slurm: HTTP 401/403/511 or error 1007), and again
    after it was read anew: a credential problem, not a dead site."""
