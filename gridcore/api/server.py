"""Serving the center: in the foreground (``gridcore serve``) or in a background thread
of this process (the engine's embedded default, and tests).

uvicorn's access log records the client, method, path and status, never headers, and
the API takes tokens only in a header: no token reaches a log.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn

from gridcore.api.app import create_app
from gridcore.errors import StateError
from gridcore.state.store import Store

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunningCenter:
    """A center serving in a background thread: ``url`` (no trailing slash) and
    :meth:`stop`."""

    url: str
    _server: uvicorn.Server
    _thread: threading.Thread
    _closing: threading.Event

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, finish the requests under way (long polls get up to
        ``timeout_s``), and join the thread. Long polls answer at once."""
        self._closing.set()
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout_s)


def start_in_thread(
    store: Store, host: str = "127.0.0.1", port: int = 0, *, heartbeat_s: float | None = None
) -> RunningCenter:
    """Serve the center for ``store`` on ``host``:``port`` (0: a free port) in a daemon
    thread; returns once it accepts connections."""
    app = create_app(store) if heartbeat_s is None else create_app(store, heartbeat_s=heartbeat_s)
    sock = socket.create_server((host, port), family=_family(host))
    bound_host, bound_port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        log_config=None,  # leave the process's logging alone; uvicorn's loggers propagate
        timeout_graceful_shutdown=5,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="gridcore-center", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise StateError(f"the VJ center did not start on {host}:{port}")
        time.sleep(0.01)
    url = f"http://{_url_host(str(bound_host))}:{bound_port}"
    return RunningCenter(url, server, thread, app.state.center.closing)


def serve(store: Store, host: str, port: int) -> None:
    """Serve in the foreground until interrupted (``gridcore serve``); logs go wherever
    the process's logging goes (stderr for the CLI)."""
    app = create_app(store)
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, lifespan="off", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    original = server.handle_exit

    def handle_exit(sig: int, frame: FrameType | None) -> None:
        app.state.center.closing.set()  # long polls answer now: shutdown does not wait 30 s
        original(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    server.run()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
