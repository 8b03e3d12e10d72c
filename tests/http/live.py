"""Run a FastAPI app with uvicorn in a background thread on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

#: Longest wait for uvicorn to start or stop, seconds.
START_TIMEOUT_S = 30.0


class LiveApp:
    """``with LiveApp(app) as live: httpx.get(live.url + "/health")``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]},
                                        name=f"uvicorn-{self.port}", daemon=True)

    def start(self) -> LiveApp:
        """Start serving; return once uvicorn accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        self._server.should_exit = True
        self._thread.join(START_TIMEOUT_S)
        self._sock.close()

    def __enter__(self) -> LiveApp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
