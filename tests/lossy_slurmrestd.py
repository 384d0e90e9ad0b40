"""A proxy in front of a real slurmrestd that loses the answers to submissions.

Every request is passed on to slurmrestd unchanged. A job submission (``POST
.../job/submit``) is carried out by slurmrestd, and then its answer is, in the order
the schedule gives (one fault per submission, the last repeating):

* ``"ok"``: passed back;
* ``"reset"``: lost: the client's connection is reset (RST) instead;
* ``"late"``: passed back only ``late_s`` after slurmrestd gave it (longer than the
  client's timeout: the client has given up by then);
* ``"drop"``: the request itself is lost: never passed on, the connection reset.

Only loopback: the proxy listens on 127.0.0.1 and talks to the cluster's own REST URL.
What it did is kept in ``faults`` (one entry per submission).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

FAULTS = ("ok", "reset", "late", "drop")


class LossySlurmrestd:
    def __init__(self, upstream: str, schedule: Sequence[str], late_s: float) -> None:
        unknown = sorted(set(schedule) - set(FAULTS))
        if unknown or not schedule:
            raise ValueError(f"schedule: faults are {FAULTS}, got {list(schedule)}")
        self.upstream = upstream.rstrip("/")
        self.schedule = list(schedule)
        self.late_s = late_s
        self.faults: list[str] = []
        self._lock = threading.Lock()
        self._session = requests.Session()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> LossySlurmrestd:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._session.close()

    def next_fault(self, method: str, path: str) -> str:
        if method != "POST" or not path.rstrip("/").endswith("/job/submit"):
            return "ok"
        with self._lock:
            fault = self.schedule[min(len(self.faults), len(self.schedule) - 1)]
            self.faults.append(fault)
            return fault

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        return self._session.request(
            method, self.upstream + path, headers=headers, data=body or None, timeout=60
        )


def _handler(proxy: LossySlurmrestd) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: pytest captures nothing useful from it."""

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            fault = proxy.next_fault(self.command, self.path)
            if fault == "drop":
                self._reset()
                return
            passed = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in ("host", "content-length", "connection")
            }
            answer = proxy.forward(self.command, self.path, passed, body)
            if fault == "reset":
                self._reset()
                return
            if fault == "late":
                time.sleep(proxy.late_s)
            try:
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "text/plain"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)
            except OSError:
                self.close_connection = True  # the client gave up waiting

        def _reset(self) -> None:
            # SO_LINGER 0: close with RST, as a middlebox or a crashed server does
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

        do_GET = do_POST = do_DELETE = _relay

    return Handler
