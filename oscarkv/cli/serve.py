"""``oscarkv serve``: load a model, build the engine, refuse a mismatched artifact, serve HTTP.

Role: the command-line face of ``oscarkv.server`` (registered in
``oscarkv.cli_commands.COMMANDS``). Flags derive from :class:`~oscarkv.config.EngineConfig`,
:class:`~oscarkv.config.KVConfig` (shared with ``oscarkv generate``) and
:class:`~oscarkv.server.config.ServerConfig`. :func:`build_server` does everything but the
network (tests and ``oscarkv bench-serve`` call it); :func:`serve` binds the socket and runs
uvicorn until interrupted.

Start-up refuses a rotation artifact that does not match the model: ``Artifact.load`` raises
``ArtifactError`` naming the field, reported as ``oscarkv serve: error: ...`` with exit status
2 — never a fallback to an identity rotation. It logs the KV capacity per tier, the BPE and
the artifact's manifest. ``--model default --kv oscar`` without ``--rotations`` uses the
default model's cached calibration (calibrating it once if missing).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from oscarkv.cli import add_fields, pick
from oscarkv.server.bench import run_bench_serve, setup_bench_serve
from oscarkv.server.config import ServerConfig

log = logging.getLogger("oscarkv.serve")
SERVER_FIELDS = ["host", "port", "served_model_name", "max_model_len", "default_max_tokens"]


@dataclass
class Built:
    """What :func:`build_server` hands back: the app and the engine it drives (close it after)."""

    app: object  # fastapi.FastAPI
    engine: object  # AsyncEngine
    cfg: ServerConfig


def setup_serve(p: argparse.ArgumentParser) -> None:
    """Serve the OpenAI API (chat, completions, SSE streaming, /metrics) over the paged INT2 engine."""
    from oscarkv.engine.cli import _engine_args

    _engine_args(p)
    add_fields(p, ServerConfig, SERVER_FIELDS)


def run_serve(args: argparse.Namespace) -> int:
    built = build_server(args)
    try:
        serve(built.app, built.cfg)
    finally:
        built.engine.close()
    return 0


def build_server(args: argparse.Namespace) -> Built:
    """Load the model and artifact, build the engine and the app; ``UserError`` on bad input."""
    from oscarkv.cli_commands import UserError, _load
    from oscarkv.engine.async_engine import AsyncEngine
    from oscarkv.engine.cli import _engine_config
    from oscarkv.engine.engine import LLMEngine
    from oscarkv.engine.llm import load_artifact
    from oscarkv.server.app import create_app, served_model

    try:
        cfg = pick(ServerConfig, args, served_model_name=args.served_model_name or args.model)
    except ValueError as e:
        raise UserError(str(e)) from e
    engine_cfg = _engine_config(args)
    loaded = _load(args.model, args.dtype)
    try:
        artifact = load_artifact(loaded, args.kv, args.rotations)
        engine = LLMEngine.from_hf(loaded.model, engine_cfg, artifact, loaded.tokenizer)
    except ValueError as e:  # ArtifactError names the mismatched field
        raise UserError(str(e)) from e
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


COMMANDS = {"serve": (setup_serve, run_serve), "bench-serve": (setup_bench_serve, run_bench_serve)}
