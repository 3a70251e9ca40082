"""Flags of the ``oscarkv`` command, derived from the typed configs.

``add_fields`` turns dataclass fields into ``--flags`` whose help is the field's docstring (as
plain text) and whose default is shown as it would be typed; ``config_from`` builds the config
back from the parsed arguments. Lists are always comma-separated (``--contexts 4096,8192``).
``engine_args``/``engine_config``: the engine's flags, shared by ``generate`` and ``serve``.
A config check that fails names the field (``ServerConfig.port``); ``in_flag_words`` says it as the
flag that sets the field (``--port``), from the parser's own flags (``flag_names``).
Nothing here imports torch: ``oscarkv --help`` answers without it.
"""

from __future__ import annotations

import argparse
import sys
import ast
import inspect
import re
import textwrap
from dataclasses import MISSING, fields
from functools import cache
from pathlib import Path

from oscarkv.config import (CACHE_DIR, DEVICES, DTYPES, ENGINE_METHODS, SPECULATIVE_METHODS, DistributedConfig,
                            EngineConfig, KVConfig, SpeculativeConfig)


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback (exit status 2)."""


def plain(doc: str) -> str:
    """A docstring as plain one-line help: reStructuredText roles and double backticks removed."""
    doc = re.sub(r":[a-z]+:`(~?)([^`]+)`", lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), doc)
    return " ".join(doc.replace("``", "").split()).replace("%", "%%")


@cache
def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal after each field), as plain text."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body, docs = tree.body[0].body, {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = plain(str(nxt.value.value))
    return docs


def shown(default, flag: str = "") -> str:
    """A default as the user would type it."""
    if isinstance(default, bool):
        return flag if default else "--no-" + flag[2:]
    if isinstance(default, (tuple, list)):
        return ",".join(map(str, default))
    return "auto" if default is None else str(default)


def csv(kind=str):
    """An argparse type for a comma-separated list."""
    def parse(s: str) -> tuple:
        try:
            return tuple(kind(x) for x in s.split(",") if x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {s!r}") from None
    return parse


def _scalar_type(annotation) -> type:
    """The element type a field's annotation names (``float``, ``int``, else ``str``)."""
    return float if "float" in str(annotation) else int if "int" in str(annotation) else str


def add_fields(parser: argparse.ArgumentParser, cls, names: list[str]) -> None:
    """Add ``--name`` flags for the given dataclass fields, typed and documented from the class."""
    for f in fields(cls):
        if f.name not in names:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else f.default_factory()
        doc = field_docs(cls).get(f.name, "")
        if isinstance(default, bool) or "bool" in str(f.type):  # bool | None: decided at run time
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f"{doc} (default: {'auto' if default is None else shown(default, flag)})")
        elif isinstance(default, tuple) or "tuple" in str(f.type):  # tuple | None: decided at run time
            kind = type(default[0]) if default else _scalar_type(f.type)
            parser.add_argument(flag, type=csv(kind), default=default, metavar=f.name.upper(),
                                help=f"{doc} (comma-separated; default: {'auto' if default is None else shown(default)})")
        else:
            parser.add_argument(flag, type=_scalar_type(f.type), default=default, help=f"{doc} (default: {shown(default)})")


def config_from(cls, args: argparse.Namespace, **extra):
    """``cls`` from the parsed arguments that name its fields (plus ``extra``); a bad value is a UserError."""
    names = {f.name for f in fields(cls)} - set(extra)
    try:
        return cls(**{k: v for k, v in vars(args).items() if k in names}, **extra)
    except ValueError as e:
        raise UserError(str(e)) from e


FIELD_PATH = re.compile(r"\b[A-Z][A-Za-z0-9]*((?:\.[a-z_][a-z0-9_]*)+(?:/[a-z_][a-z0-9_]*)*)")
"""A config field as validation messages name it: ``ServerConfig.port``, ``EngineConfig.kv.sink``,
``KVConfig.key_bits/value_bits`` (group 1: the path after the class name)."""


def flag_names(parser: argparse.ArgumentParser, command: str | None = None) -> dict[str, str]:
    """``{dest: flag}`` for every option of ``parser`` (of its subcommand ``command`` only, when given)
    and of the subcommands below: the flag a user types to set that attribute of the parsed arguments."""
    names: dict[str, str] = {}
    for action in parser._actions:  # NOTE: argparse lists a parser's actions in no public attribute
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if command in (None, name):
                    names |= flag_names(sub)
        elif action.option_strings and command is None:
            names.setdefault(action.dest, max(action.option_strings, key=lambda s: s.startswith("--")))
    return names


def in_flag_words(message: str, flags: dict[str, str]) -> str:
    """``message`` with each config field it names (``FIELD_PATH``) said as the flag that sets the field:
    ``ServerConfig.port`` → ``--port``, ``EngineConfig.kv.sink`` → ``--sink``, ``KVConfig.key_bits/value_bits``
    → ``--key-bits/--value-bits``. Flags set the field of the same name (``add_fields``, ``config_from``);
    a field no flag sets keeps its config name."""
    def said(m: re.Match) -> str:
        names = m.group(1).rsplit(".", 1)[-1].split("/")
        return "/".join(flags[n] for n in names) if all(n in flags for n in names) else m.group(0)
    return FIELD_PATH.sub(said, message)


def model_args(p: argparse.ArgumentParser, dtype: str = "auto", device: str = "auto") -> None:
    p.add_argument("--model", default="default",
                   help="'default' (the embedded SmolLM2-135M-Instruct), a Hugging Face model directory, a .gguf file "
                        "or a Hugging Face Hub id ORG/NAME[@REVISION] (its cache; HF_HUB_OFFLINE=1 reads only the cache) "
                        "(default: default)")
    p.add_argument("--dtype", choices=DTYPES, default=dtype,
                   help=f"model compute dtype; auto: bfloat16 on CUDA, float32 on a CPU (default: {dtype})")
    p.add_argument("--device", choices=DEVICES, default=device,
                   help="where the model (and the engine, and its KV cache) runs; auto: the first CUDA device when "
                        f"one is visible, else the CPU (default: {device})")


def load(spec: str, dtype: str, device: str = "auto", tensor_parallel_size: int = 1):
    """The model named by ``--model``/``--dtype``/``--device`` (held on the host for a tensor-parallel
    engine on GPUs: ``load_model``); a missing or unsupported model (or an absent device) is a UserError."""
    from oscarkv.models.loader import ModelLoadError, load_model

    try:
        return load_model(spec, dtype, device=device, tensor_parallel_size=tensor_parallel_size)
    except ModelLoadError as e:
        raise UserError(str(e)) from e


def artifact(loaded, args: argparse.Namespace):
    """The artifact ``--kv``/``--rotations``/``--cache-dir`` name (``oscarkv.calibrate.default.artifact_for``:
    without ``--rotations``, calibrated once and cached for a model that has none), or a UserError."""
    from oscarkv.calibrate.default import artifact_for

    try:
        return artifact_for(loaded, args.kv, args.rotations, args.cache_dir)
    except ValueError as e:  # ArtifactError names the file and the field
        raise UserError(str(e)) from e


RECIPE_FLAGS = ("sink", "recent", "page_size", "key_bits", "value_bits")
"""The ``KVConfig`` fields the engine's flags set over the artifact's recipe (``engine_config``)."""


SPEC_FLAGS = ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "min_accepted_tokens", "measured_floor")
"""The ``SpeculativeConfig`` fields the engine's flags set (beside ``--speculative``, its method)."""


def recipe_args(p: argparse.ArgumentParser) -> None:
    """The flags that set ``RECIPE_FLAGS`` over the artifact's recipe (:func:`recipe_given` reads them)."""
    add_fields(p, KVConfig, list(RECIPE_FLAGS))
    # NOTE: unset windows, pages and bits come from the artifact's recipe (oscarkv calibrate --max-bpe), else KVConfig's
    p.set_defaults(**dict.fromkeys(RECIPE_FLAGS))


def recipe_given(args: argparse.Namespace) -> dict:
    """The ``KVConfig`` fields the flags of :func:`recipe_args` set (``quant.artifact.recipe_with``'s ``given``)."""
    return {k: getattr(args, k) for k in RECIPE_FLAGS if getattr(args, k) is not None}


def engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags (``generate`` and ``serve``): model, KV method and artifact, KVConfig windows,
    EngineConfig sizes."""
    model_args(p, "auto")
    p.add_argument("--kv", choices=ENGINE_METHODS, default="oscar", help="KV storage method (default: oscar)")
    p.add_argument("--rotations", type=Path, default=None,
                   help="artifact directory for --kv oscar (default: the default model's, shipped with oscarkv; for "
                        "another model, one calibrated once at start-up and cached under --cache-dir)")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                   help=f"where artifacts calibrated at start-up are cached, by model fingerprint (default: {CACHE_DIR})")
    recipe_args(p)
    add_fields(p, EngineConfig, ["kv_memory_bytes", "max_num_seqs", "max_num_batched_tokens", "prefill_chunk",
                                 "enable_prefix_caching", "prefix_windows", "resume_turns", "resume_questions", "overlap",
                                 "tensor_parallel_size",
                                 "l2_prefetch", "l2_prefetch_mib", "piecewise_graph_buckets", "piecewise_batches"])
    p.add_argument("--speculative", choices=SPECULATIVE_METHODS, default="none",
                   help=field_docs(SpeculativeConfig)["method"] + " (default: none)")
    add_fields(p, SpeculativeConfig, list(SPEC_FLAGS))


def engine_config(args: argparse.Namespace, artifact=None) -> EngineConfig:
    """The :class:`EngineConfig` the flags of :func:`engine_args` name; a bad value is a UserError.
    Windows, pages and bits the flags leave unset come from the artifact's recipe when it holds one
    (``oscarkv.quant.artifact.apply_recipe``), else from ``KVConfig``'s defaults: ``--sink 64`` widens the recipe's
    sink and keeps its per-head bits; ``--key-bits``/``--value-bits`` replace its allocation."""
    from oscarkv.quant.artifact import recipe_with

    if args.rotations is not None and args.kv != "oscar":
        raise UserError(f"--rotations {args.rotations}: only --kv oscar uses a rotation artifact, and --kv {args.kv} "
                        "would ignore it; drop --rotations or use --kv oscar")
    try:
        kv = recipe_with(config_from(KVConfig, argparse.Namespace(method=args.kv)), artifact, recipe_given(args))
    except ValueError as e:
        raise UserError(str(e)) from e
    spec = config_from(SpeculativeConfig, argparse.Namespace(method=args.speculative, **{k: getattr(args, k) for k in SPEC_FLAGS}))
    return config_from(EngineConfig, args, kv=kv, speculative=spec,
                       distributed=config_from(DistributedConfig, args))  # distributed flags: serve's


def say_windows(cfg: EngineConfig, artifact) -> None:
    """The start-up line saying which windows run and whether they are the artifact's recipe (stderr)."""
    from oscarkv.quant.artifact import describe_recipe

    print(f"oscarkv: {describe_recipe(cfg.kv, artifact)}", file=sys.stderr)
