"""Start a server from typed configs: build the engine and the app, bind, run uvicorn.

Role: what ``oscarkv serve`` (``oscarkv.cli.serve``) and tests call; no argparse here.
:func:`build_server` does everything but the network from a loaded model, its artifact (already
validated by ``oscarkv.calibrate.default.artifact_for``), an
:class:`~oscarkv.config.EngineConfig` and a :class:`~oscarkv.config.ServerConfig`; bad values
raise ``ValueError``. It logs the KV capacity per tier, the BPE and the artifact's manifest.
:func:`serve` binds the socket and runs uvicorn until interrupted; :func:`serving_in_thread`
runs an app on a free loopback port for tests and benchmarks.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from oscarkv.config import EngineConfig, ServerConfig
from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.engine import LLMEngine
from oscarkv.server.app import create_app, served_model

log = logging.getLogger("oscarkv.serve")


@dataclass
class Built:
    """What :func:`build_server` hands back: the app and the engine it drives (close it after)."""

    app: object  # fastapi.FastAPI
    engine: object  # AsyncEngine
    cfg: ServerConfig


def build_server(loaded, artifact, engine_cfg: EngineConfig, cfg: ServerConfig) -> Built:
    """The engine over ``loaded`` (a ``LoadedModel``) and the app serving it; ``ValueError`` on a bad config."""
    engine = LLMEngine.from_hf(loaded.model, engine_cfg, artifact, loaded.tokenizer)
    model = served_model(engine, loaded.config, loaded.tokenizer, cfg.served_model_name, cfg)
    _log_startup(engine, artifact, model.max_model_len)
    async_engine = AsyncEngine(engine)
    return Built(create_app(async_engine, model, cfg), async_engine, cfg)


def _log_startup(engine, artifact, max_model_len: int) -> None:
    d = engine.describe()
    log.info("oscarkv serve: kv=%s, KV capacity bf16=%d tokens, int2=%d tokens, bytes/token %s, BPE at capacity %.4f, "
             "max_model_len=%d", d["method"], d["bf16_tokens"], d["int2_tokens"],
             {k: round(v, 1) for k, v in d["bytes_per_token"].items()}, d["bpe_at_capacity"], max_model_len)
    if artifact is not None:
        log.info("oscarkv serve: rotation artifact manifest %s", json.dumps(artifact.manifest, sort_keys=True))


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``port`` 0 lets the OS choose (read it with ``getsockname``)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _uvicorn(app, log_level: str):
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5,
                                         backlog=2048, access_log=False))


def serve(app, cfg: ServerConfig) -> None:
    """Serve ``app`` on ``cfg.host:cfg.port`` until interrupted (the bound address is logged)."""
    sock = bind(cfg.host, cfg.port)
    log.info("oscarkv serve: listening on http://%s:%d", cfg.host, sock.getsockname()[1])
    _uvicorn(app, "info").run(sockets=[sock])


@contextmanager
def serving_in_thread(app, host: str = "127.0.0.1"):
    """Run ``app`` on a free loopback port in a background thread; yields the base URL."""
    sock = bind(host, 0)
    server = _uvicorn(app, "warning")
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

