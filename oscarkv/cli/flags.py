"""Flags of the ``oscarkv`` command, derived from the typed configs.

``add_fields`` turns dataclass fields into ``--flags`` whose help is the field's docstring (as
plain text) and whose default is shown as it would be typed; ``config_from`` builds the config
back from the parsed arguments. Lists are always comma-separated (``--contexts 4096,8192``).
``engine_args``/``engine_config``: the engine's flags, shared by ``generate`` and ``serve``.
Nothing here imports torch: ``oscarkv --help`` answers without it.
"""

from __future__ import annotations

import argparse
import sys
import ast
import inspect
import re
import textwrap
from dataclasses import MISSING, asdict, fields
from functools import cache
from pathlib import Path

from oscarkv.config import DEVICES, DTYPES, ENGINE_METHODS, EngineConfig, KVConfig


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
        elif isinstance(default, tuple):
            kind = type(default[0]) if default else _scalar_type(f.type)
            parser.add_argument(flag, type=csv(kind), default=default, metavar=f.name.upper(),
                                help=f"{doc} (comma-separated; default: {shown(default)})")
        else:
            parser.add_argument(flag, type=_scalar_type(f.type), default=default, help=f"{doc} (default: {shown(default)})")


def config_from(cls, args: argparse.Namespace, **extra):
    """``cls`` from the parsed arguments that name its fields (plus ``extra``); a bad value is a UserError."""
    names = {f.name for f in fields(cls)} - set(extra)
    try:
        return cls(**{k: v for k, v in vars(args).items() if k in names}, **extra)
    except ValueError as e:
        raise UserError(str(e)) from e


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


def artifact(loaded, kv: str, rotations: Path | None):
    """The artifact ``--kv``/``--rotations`` name (``oscarkv.calibrate.default.artifact_for``), or a UserError."""
    from oscarkv.calibrate.default import artifact_for

    try:
        return artifact_for(loaded, kv, rotations)
    except ValueError as e:  # ArtifactError names the file and the field
        raise UserError(str(e)) from e


def engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags (``generate`` and ``serve``): model, KV method and artifact, KVConfig windows,
    EngineConfig sizes."""
    model_args(p, "auto")
    p.add_argument("--kv", choices=ENGINE_METHODS, default="oscar", help="KV storage method (default: oscar)")
    p.add_argument("--rotations", type=Path, default=None,
                   help="artifact directory for --kv oscar (default: the default model's artifact, shipped with oscarkv)")
    add_fields(p, KVConfig, ["sink", "recent", "page_size", "key_bits", "value_bits"])
    # NOTE: unset windows and bits come from the artifact's recipe (oscarkv calibrate --max-bpe), else KVConfig's defaults
    p.set_defaults(sink=None, recent=None, key_bits=None, value_bits=None)
    add_fields(p, EngineConfig, ["kv_memory_bytes", "max_num_seqs", "max_num_batched_tokens", "prefill_chunk",
                                 "enable_prefix_caching", "overlap", "tensor_parallel_size"])


def engine_config(args: argparse.Namespace, artifact=None) -> EngineConfig:
    """The :class:`EngineConfig` the flags of :func:`engine_args` name; a bad value is a UserError.
    Windows (and bits) the flags leave unset come from the artifact's recipe when it holds one
    (``oscarkv.quant.artifact.apply_recipe``), else from ``KVConfig``'s defaults."""
    from oscarkv.quant.artifact import apply_recipe

    if args.rotations is not None and args.kv != "oscar":
        raise UserError(f"--rotations {args.rotations}: only --kv oscar uses a rotation artifact, and --kv {args.kv} "
                        "would ignore it; drop --rotations or use --kv oscar")
    base = KVConfig()
    given = {k: getattr(args, k) for k in ("sink", "recent", "key_bits", "value_bits") if getattr(args, k) is not None}
    kv = config_from(KVConfig, argparse.Namespace(method=args.kv, page_size=args.page_size, **{
        k: given.get(k, getattr(base, k)) for k in ("sink", "recent", "key_bits", "value_bits")}))
    if args.sink is None and args.recent is None:  # the recipe's windows and bits; bits the flags set win
        mine = {f"layer_{k}": () for k in given if k.endswith("_bits")}  # a flag's bits replace the recipe's allocation
        kv = config_from(KVConfig, argparse.Namespace(**{**asdict(apply_recipe(kv, artifact)), **given, **mine}))
    return config_from(EngineConfig, args, kv=kv)


def say_windows(cfg: EngineConfig, artifact) -> None:
    """The start-up line saying which windows run and whether they are the artifact's recipe (stderr)."""
    from oscarkv.quant.artifact import describe_recipe

    print(f"oscarkv: {describe_recipe(cfg.kv, artifact)}", file=sys.stderr)
