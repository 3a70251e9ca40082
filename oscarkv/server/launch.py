"""Start a server from typed configs: build the engine and the app, bind, run uvicorn, shut down.

Role: what ``oscarkv serve`` (``oscarkv.cli.serve``) and tests call; no argparse here.
:func:`bind` takes the port first (``oscarkv serve`` binds before loading the model, so a port in
use costs no loading time). :func:`build_server` does everything but the network from a loaded
model, its artifact (already validated by ``oscarkv.calibrate.default.artifact_for``), an
:class:`~oscarkv.config.EngineConfig` and a :class:`~oscarkv.config.ServerConfig`; bad values
raise ``ValueError``. It logs the KV capacity per tier, the BPE and a few lines about the
artifact. :func:`serve` runs uvicorn on the bound socket until SIGTERM or SIGINT, then shuts
down gracefully (:class:`GracefulServer`: stop accepting, drain within
``ServerConfig.shutdown_grace``, end the rest with an error event, free their pages, return so
the process exits 0). :func:`serving_in_thread` runs an app on a free loopback port for tests
and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from oscarkv.config import EngineConfig, ServerConfig
from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.engine import LLMEngine
from oscarkv.server.app import create_app, served_model
from oscarkv.server.replica import attach

log = logging.getLogger("oscarkv.serve")


@dataclass
class Built:
    """What :func:`build_server` hands back: the app and the engine it drives (close it after)."""

    app: object  # fastapi.FastAPI
    engine: AsyncEngine
    cfg: ServerConfig


def build_server(loaded, artifact, engine_cfg: EngineConfig, cfg: ServerConfig) -> Built:
    """The engine over ``loaded`` (a ``LoadedModel``) and the app serving it; ``ValueError`` on a bad config."""
    engine = LLMEngine.from_hf(loaded.model, engine_cfg, artifact, loaded.tokenizer, device=loaded.runs_on)
    model = served_model(engine, loaded.config, loaded.tokenizer, cfg.served_model_name, cfg)
    _log_startup(engine, artifact, model.max_model_len)
    async_engine = AsyncEngine(engine)
    app = create_app(async_engine, model, cfg)
    attach(app, engine, cfg)
    return Built(app, async_engine, cfg)


def _log_startup(engine, artifact, max_model_len: int) -> None:
    d = engine.describe()
    log.info("oscarkv serve: kv=%s, KV capacity bf16=%d tokens, int2=%d tokens, bytes/token %s, BPE at capacity %.4f, "
             "max_model_len=%d", d["method"], d["bf16_tokens"], d["int2_tokens"],
             {k: round(v, 1) for k, v in d["bytes_per_token"].items()}, d["bpe_at_capacity"], max_model_len)
    for line in artifact.summary() if artifact is not None else []:
        log.info("oscarkv serve: %s", line)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``port`` 0 lets the OS choose (read it with ``getsockname``).
    ``OSError`` when the address is taken or cannot be bound."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # NOTE: asyncio sets TCP_NODELAY on what it accepts only then
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # NOTE: Linux still refuses a port someone listens on
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class GracefulServer(uvicorn.Server):
    """uvicorn whose SIGTERM or SIGINT drains the app first; a second signal stops at once.

    uvicorn alone stops accepting, waits, cancels what still runs without a word to its client,
    and then raises the signal again, so the process ends by it (exit status -15). Here the
    first signal closes the listening sockets, lets the app's requests run for the grace period
    (``Server.drain``: those still running then end with an error event), and ends uvicorn's
    loop; :meth:`run` then returns normally."""

    def __init__(self, config: uvicorn.Config, grace: float) -> None:
        super().__init__(config)
        self.grace, self._loop, self._draining = grace, None, False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:
        if self._draining:  # a second signal: stop now
            self.should_exit = self.force_exit = True
            return
        if self._loop is None:  # not serving yet: nothing to drain
            self.should_exit = True
            return
        self._draining = True
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain(signal.Signals(sig).name)))

    async def _drain(self, name: str) -> None:
        for server in self.servers:  # stop accepting; open connections may still ask (and get a 503)
            server.close()
        log.info("oscarkv serve: %s: no new connections; draining requests in flight for up to %g s", name, self.grace)
        finished, cut = await self.config.app.state.server.drain(self.grace)
        log.info("oscarkv serve: %d request(s) finished within the grace period, %d ended with an error", finished, cut)
        self.should_exit = True


def _config(app, log_level: str, cancel_after: float) -> uvicorn.Config:
    """``cancel_after``: uvicorn's own grace, after which it cancels what still runs (under
    :class:`GracefulServer` only a backstop: ``Server.drain`` has ended every request by then)."""
    return uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=cancel_after, backlog=2048,
                          access_log=False)


def serve(built: Built, sock: socket.socket) -> None:
    """Serve ``built.app`` on the bound ``sock`` until SIGTERM or SIGINT, drain, and free the pages."""
    cfg = built.cfg
    if not cfg.api_key and not is_loopback(cfg.host):
        log.warning("oscarkv serve: WARNING: listening on %s, beyond loopback, without an API key: anyone who can "
                    "reach it can use the model (set OSCARKV_API_KEY or --api-key)", cfg.host)
    log.info("oscarkv serve: listening on http://%s:%d", cfg.host, sock.getsockname()[1])
    GracefulServer(_config(built.app, "info", cfg.shutdown_grace + 10), cfg.shutdown_grace).run(sockets=[sock])
    log.info("oscarkv serve: stopped; KV pages still held: %d", _settled_pages(built.engine))


def _settled_pages(engine: AsyncEngine, timeout: float = 5.0) -> int:
    """KV pages held once the engine thread has applied the last aborts (or ``timeout`` passed)."""
    end = time.monotonic() + timeout
    while True:
        stats = engine.stats()
        used = sum(t.pages_used for t in stats.tiers.values())
        if (used == 0 and not stats.running and not stats.waiting) or time.monotonic() > end:
            return used
        time.sleep(0.02)


@contextlib.contextmanager
def serving_in_thread(app, host: str = "127.0.0.1"):
    """Run ``app`` on a free loopback port in a background thread; yields the base URL."""
    sock = bind(host, 0)
    server = uvicorn.Server(_config(app, "warning", 5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="oscarkv-uvicorn", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server thread stopped during start-up")
            threading.Event().wait(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
