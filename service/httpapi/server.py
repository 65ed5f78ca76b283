"""Running the API under uvicorn: :func:`serve` for the coordinator process (blocks; SIGTERM or
SIGINT stop it cleanly), :class:`ServerThread` for tests and benchmarks, :func:`free_port`."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType

import uvicorn
from fastapi import FastAPI

from recovery import proc
from recovery.errors import RecoverError

DEFAULT_HOST = "127.0.0.1"


def config(app: FastAPI, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn settings for this API: uvloop and httptools when installed (``auto``; they come
    with ``uvicorn[standard]`` and are the fastest loop and parser uvicorn has), no access log
    (one line per event request would cost more than the request), lifespan on
    (the app stops its commit thread there)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="auto",
        http="auto",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=10,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, except that SIGTERM/SIGINT only ask it to stop and :func:`serve`
    then returns (uvicorn's own handlers re-raise the signal after shutdown, which ends the
    process before the caller can close the journal). A second signal forces the exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    on_stop: Callable[[], None] | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True
        elif self.on_stop is not None:
            self.on_stop()
        self.should_exit = True


def serve(
    app: FastAPI,
    host: str = DEFAULT_HOST,
    port: int = 8470,
    log_level: str = "info",
    *,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM or SIGINT, then return (call it from the
    main thread, where signal handlers can be installed): new connections stop, requests in
    flight finish (their events are committed and acknowledged), the app's lifespan ends, and
    the caller closes what it opened (the journal). A second signal skips the wait.

    Loopback by default: put a TLS-terminating proxy in front to listen anywhere else.
    ``on_stop`` is called at the first signal, before the server stops taking requests (to
    end long polls, which uvicorn would otherwise wait for). Raises RecoverError when the
    address cannot be bound.
    """
    server = _Server(config(app, host, port, log_level))
    server.on_stop = on_stop
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits the process when it cannot bind
        raise RecoverError(f"could not serve on {host}:{port} (see the log above)") from e
    if not server.started:
        raise RecoverError(f"could not serve on {host}:{port} (address in use or not allowed)")


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port on ``host``, free now and reserved for a few minutes against every other
    caller on this machine (:func:`recovery.proc.free_ports`)."""
    return proc.free_ports(1, host)[0]


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
