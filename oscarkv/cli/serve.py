"""``oscarkv serve``: the OpenAI-compatible API over the paged engine (``oscarkv.server``).

Flags derive from :class:`~oscarkv.config.EngineConfig` and :class:`~oscarkv.config.KVConfig`
(:func:`oscarkv.cli.flags.engine_args`, shared with ``oscarkv generate``) and from
:class:`~oscarkv.config.ServerConfig`. Every start-up fault is one line and exit status 2, found
as early as it can be: the ``serve`` extra and the flags first, then the port (bound before the
model loads), then the model and the rotation artifact (the file, tensor or field named; never a
fallback to an identity rotation). ``--kv oscar`` without ``--rotations`` uses the default model's
shipped artifact, or for another model the one calibrated once at start-up and cached under ``--cache-dir``
(``oscarkv.calibrate.default``).

The API key comes from ``--api-key`` or, so that it stays out of process listings, from the
environment variable ``OSCARKV_API_KEY`` (:data:`API_KEY_ENV`) — the one environment read of
oscarkv, done here in the command layer.
"""

from __future__ import annotations

import argparse
import os

from oscarkv.cli.flags import UserError, add_fields, config_from, engine_args, engine_config
from oscarkv.config import DistributedConfig, ReplicaConfig, ServerConfig

SERVER_FIELDS = ["host", "port", "served_model_name", "max_model_len", "default_max_tokens", "max_request_bytes",
                 "shutdown_grace", "api_key", "protect_metrics", "kv_events_endpoint"]
API_KEY_ENV = "OSCARKV_API_KEY"
"""Environment variable holding the API key when ``--api-key`` is not given (as vLLM's ``VLLM_API_KEY``)."""
REPLICA_FIELDS = ["data_parallel_size", "router_policy", "replica_startup_timeout"]
NOT_FORWARDED = {"command", "verbose", "host", "port", "api_key", "kv_events_endpoint", *REPLICA_FIELDS}
"""Flags a replica of ``--data-parallel-size`` does not inherit: the launcher sets them (or refuses them)."""
NODE_FIELDS = ["nnodes", "node_rank", "master_addr", "master_port", "rendezvous_timeout"]
SERVE_EXTRA = ("fastapi", "starlette", "uvicorn", "prometheus_client", "pydantic")


def setup(p: argparse.ArgumentParser) -> None:
    """Serve the OpenAI API (chat, completions, SSE streaming, /metrics) over the paged INT2 engine."""
    engine_args(p)
    add_fields(p, DistributedConfig, NODE_FIELDS)
    add_fields(p, ReplicaConfig, REPLICA_FIELDS)
    add_fields(p, ServerConfig, SERVER_FIELDS)


def server_config(args: argparse.Namespace) -> ServerConfig:
    key = args.api_key or os.environ.get(API_KEY_ENV, "")
    return config_from(ServerConfig, args, served_model_name=args.served_model_name or args.model, api_key=key)


def launch_module():
    """``oscarkv.server.launch``, or a UserError when the ``serve`` extra is not installed."""
    try:
        from oscarkv.server import launch
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in SERVE_EXTRA:
            raise
        raise UserError(f"serving needs the 'serve' extra (module {e.name!r} is missing): "
                        "pip install 'oscarkv[serve]'") from None
    return launch


def build(args: argparse.Namespace):
    """The parsed flags → a built server (``oscarkv.server.launch.Built``); a UserError on bad input."""
    from oscarkv.cli.flags import artifact, load, say_windows

    launch = launch_module()
    cfg, _ = server_config(args), engine_config(args)  # bad flags are reported before the model loads
    loaded = load(args.model, args.dtype, args.device, args.tensor_parallel_size)
    art = artifact(loaded, args)
    engine_cfg = engine_config(args, art)
    say_windows(engine_cfg, art)
    try:
        return launch.build_server(loaded, art, engine_cfg, cfg)
    except ValueError as e:
        raise UserError(str(e)) from e


def recipe_page_size(args: argparse.Namespace) -> int:
    """The page size an OSCAR replica would take from its artifact's recipe without loading the model: that of
    ``--rotations``' manifest or, for ``--model default``, of the shipped one; else ``KVConfig``'s."""
    import json

    from oscarkv.config import KVConfig
    from oscarkv.data import default_recipe
    from oscarkv.quant.artifact import MANIFEST_FILE

    recipe = None
    if args.kv == "oscar" and args.rotations is not None and (args.rotations / MANIFEST_FILE).is_file():
        recipe = json.loads((args.rotations / MANIFEST_FILE).read_text()).get("recipe")
    elif args.kv == "oscar" and args.model == "default":
        recipe = default_recipe()["recipe"]
    return (recipe or {}).get("page_size", KVConfig().page_size)


def run_node(args: argparse.Namespace) -> int:
    """``--node-rank N > 0``: host this node's tensor-parallel ranks for node 0's server (no model load, no port)."""
    from oscarkv.engine.workers import run_node as node_main
    from oscarkv.models.loader import ModelLoadError, resolve_device

    cfg = engine_config(args)
    try:
        device = resolve_device(args.device)
    except ModelLoadError as e:
        raise UserError(str(e)) from e
    return node_main(cfg, device)


def replica_argv(args: argparse.Namespace) -> list[str]:
    """The flags of ``args`` that every replica gets, as they would be typed (unset ones left out)."""
    out = []
    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if name in NOT_FORWARDED or value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return out


def run_replicas(args: argparse.Namespace) -> int:
    """``--data-parallel-size N > 1``: N replicas behind vllm-router (``oscarkv.server.replicas``)."""
    from oscarkv.server import replicas

    cfg = config_from(ReplicaConfig, args)
    server_config(args), engine_config(args)  # bad flags are reported before anything starts
    # the router's block size is the replicas' page size by construction: each replica gets it as a flag
    args.page_size = args.page_size or recipe_page_size(args)
    if args.nnodes > 1:
        raise UserError("--data-parallel-size starts its replicas on this host; for replicas spread over several "
                        "hosts start each one (--nnodes ...) and vllm-router --worker-urls yourself")
    if not replicas.router_available():
        raise UserError("--data-parallel-size needs vllm-router (module 'vllm_router' is missing): "
                        "pip install 'oscarkv[router]'")
    if args.api_key or os.environ.get(API_KEY_ENV):
        raise UserError("--data-parallel-size with an API key is not supported: the router would pass clients "
                        "through unchecked; put the router behind your gateway, or start replicas and router yourself")
    try:
        return replicas.run(cfg, replica_argv(args), (args.host, args.port),
                            (args.page_size, args.served_model_name or args.model))
    except replicas.LaunchError as e:
        raise UserError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    if args.node_rank > 0:
        return run_node(args)
    if args.data_parallel_size > 1:
        return run_replicas(args)
    launch = launch_module()
    cfg = server_config(args)
    engine_config(args)  # bad engine flags are reported before the port is taken
    try:
        sock = launch.bind(cfg.host, cfg.port)
    except OSError as e:
        raise UserError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e} "
                        "(is another server running there? choose another --port)") from None
    try:
        built = build(args)
        try:
            launch.serve(built, sock)
        finally:
            built.engine.close()
    finally:
        sock.close()
    return 0
