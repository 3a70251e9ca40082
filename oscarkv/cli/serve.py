"""``oscarkv serve``: the OpenAI-compatible API over the paged engine (``oscarkv.server``).

Flags derive from :class:`~oscarkv.config.EngineConfig`, :class:`~oscarkv.config.KVConfig`
(shared with ``oscarkv generate``) and :class:`~oscarkv.config.ServerConfig`. Start-up refuses a
rotation artifact that does not match the model (the field named, exit status 2; never a
fallback to an identity rotation); ``--model default --kv oscar`` without ``--rotations`` uses
the default model's cached calibration.
"""

from __future__ import annotations

import argparse

from oscarkv.cli.flags import UserError, add_fields, config_from
from oscarkv.cli.generate import engine_args, engine_config
from oscarkv.config import ServerConfig

SERVER_FIELDS = ["host", "port", "served_model_name", "max_model_len", "default_max_tokens"]


def setup(p: argparse.ArgumentParser) -> None:
    """Serve the OpenAI API (chat, completions, SSE streaming, /metrics) over the paged INT2 engine."""
    engine_args(p)
    add_fields(p, ServerConfig, SERVER_FIELDS)


def build(args: argparse.Namespace):
    """The parsed flags → a built server (``oscarkv.server.launch.Built``); a UserError on bad input."""
    from oscarkv.cli.flags import artifact, load
    from oscarkv.server.launch import build_server

    cfg = config_from(ServerConfig, args, served_model_name=args.served_model_name or args.model)
    engine_cfg = engine_config(args)
    loaded = load(args.model, args.dtype)
    try:
        return build_server(loaded, artifact(loaded, args.kv, args.rotations), engine_cfg, cfg)
    except ValueError as e:
        raise UserError(str(e)) from e


def run(args: argparse.Namespace) -> int:
    from oscarkv.server.launch import serve

    built = build(args)
    try:
        serve(built.app, built.cfg)
    finally:
        built.engine.close()
    return 0
