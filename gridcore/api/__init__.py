"""The VJ center's HTTP API (DESIGN.md "api/"): pilots and barrier components on the
clusters talk to gridcore here with a bearer token scoped to one pilot or component,
never with the state database's URL. :func:`gridcore.api.app.create_app` builds the
app; ``gridcore serve`` and :func:`gridcore.api.server.start_in_thread` serve it."""

from __future__ import annotations
