"""A notification receiver for the end-to-end sentinel tests: an http.server.ThreadingHTTPServer on 127.0.0.1 (port 0,
so each test gets its own), in a thread of the test, recording every request it is sent.

Modes:
  ok      answers 200
  error   answers 500 with a short body
  hang    accepts the request, records it, and never answers until the receiver is stopped (the test ends)
  closed  answers 200 until `close()`; the test closes it after the launch (whose reachability check needs it
          listening), so every later connect is refused

    with Receiver("ok") as rx:
        url = rx.url("/hook")
        ...
        rx.wait_for(lambda msgs: any(m["kind"] == "ended" for m in msgs), what="an ended message")
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.poll import wait_until

MODES = ("ok", "error", "hang", "closed")


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


class Receiver:
    def __init__(self, mode: str = "ok") -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self.mode = mode
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._release = threading.Event()  # set when stopping: a hanging handler lets go
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- life --------------------------------------------------------------------------------------------------
    def start(self) -> Receiver:
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with rx._lock:
                    rx._requests.append(Request(self.path, dict(self.headers.items()), body))
                if rx.mode == "hang":
                    rx._release.wait()
                    self.close_connection = True
                    return
                status = 500 if rx.mode == "error" else 200
                answer = b"receiver says no\n" if status == 500 else b"ok\n"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"receiver-{self.mode}-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening: from now on a connect to the port is refused. Idempotent."""
        self._release.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- what it saw -------------------------------------------------------------------------------------------
    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def messages(self) -> list[dict[str, Any]]:
        """The JSON bodies (webhook payloads) received so far, in order."""
        return [r.json() for r in self.requests]

    def wait_for(self, cond: Callable[[list[dict[str, Any]]], object], timeout: float = 90.0,
                 what: str = "a message") -> object:
        """cond(messages)'s first truthy value, polled; AssertionError naming `what` after timeout."""
        return wait_until(lambda: cond(self.messages()), timeout=timeout, what=f"{what} at {self.url('')}",
                          every=0.1)
