"""Applications that run as the components of a co-allocated job.

Each application is a module runnable with ``python -m gridcore.apps.<name>``; nothing
is imported here, so running a module with ``-m`` does not import it twice.
"""

from __future__ import annotations
