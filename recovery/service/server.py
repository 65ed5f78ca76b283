"""Running the API under uvicorn: :func:`serve` for the coordinator process (blocks; SIGTERM or
SIGINT stop it cleanly), :class:`ServerThread` for tests and benchmarks, :func:`free_port`."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from recovery.errors import RecoverError

DEFAULT_HOST = "127.0.0.1"


def config(app: FastAPI, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn settings for this API: uvloop and httptools (the fastest parsers uvicorn has),
    no access log (one line per event request would cost more than the request), lifespan on
    (the app stops its commit thread there)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=10,
    )


def serve(
    app: FastAPI, host: str = DEFAULT_HOST, port: int = 8470, log_level: str = "info"
) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM or SIGINT (must run in the main thread,
    where uvicorn installs its handlers): new connections stop, requests in flight finish
    (their events are committed and acknowledged), then the app's lifespan ends.

    Loopback by default: put a TLS-terminating proxy in front to listen anywhere else.
    Raises RecoverError when the address cannot be bound.
    """
    server = uvicorn.Server(config(app, host, port, log_level))
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits the process when it cannot bind
        raise RecoverError(f"could not serve on {host}:{port} (see the log above)") from e
    if not server.started:
        raise RecoverError(f"could not serve on {host}:{port} (address in use or not allowed)")


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port on ``host`` that was free a moment ago (for tests and benchmarks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerThread:
    """``app`` served by uvicorn in a background thread, as a context manager: entering waits
    until it accepts connections (at most ``start_timeout`` seconds, else RecoverError);
    leaving asks it to stop and joins the thread (requests in flight finish first)."""

    def __init__(
        self,
        app: FastAPI,
        host: str = DEFAULT_HOST,
        port: int | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.server = uvicorn.Server(config(app, self.host, self.port))
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self._start_timeout = start_timeout

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        # uvicorn has no start callback: wait for its flag, which flips once it listens.
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                self._thread.join(self._start_timeout)
                raise RecoverError(f"uvicorn did not start on {self.url}")
            time.sleep(0.005)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self._thread.join()
