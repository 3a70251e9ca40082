"""The ``oscarkv`` command: ``calibrate``, ``eval`` and ``demo`` subcommands.

Flags mirror the config dataclasses in ``oscarkv.config`` and ``oscarkv.eval.runner``; their
help text is the field docstrings. Each subcommand loads the model (``oscarkv.models``), does
one job and writes its outputs to ``--out``.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import logging
import sys
import textwrap
from dataclasses import fields
from functools import cache
from pathlib import Path

from oscarkv.config import CACHE_DIR as DEFAULT_CACHE


@cache
def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal after each field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body, docs = tree.body[0].body, {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def add_fields(parser: argparse.ArgumentParser, cls, names: list[str]) -> None:
    """Add ``--name`` flags for the given dataclass fields, typed and documented from the class."""
    defaults = cls()
    for f in fields(cls):
        if f.name not in names:
            continue
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        doc = field_docs(cls).get(f.name, "")
        if isinstance(default, bool) or f.type in (bool | None, "bool | None"):  # None: decided at run time
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=doc)
        elif isinstance(default, tuple):
            kind = type(default[0]) if default else str
            parser.add_argument(flag, type=_csv(kind), default=default, help=f"{doc} (comma-separated; default {','.join(map(str, default))})")
        else:
            kind = int if f.name == "group_size" else type(default)
            parser.add_argument(flag, type=kind, default=default, help=f"{doc} (default {default})")


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def pick(cls, args: argparse.Namespace, **extra):
    names = {f.name for f in fields(cls)} - set(extra)
    return cls(**{k: v for k, v in vars(args).items() if k in names}, **extra)


def build_parser() -> argparse.ArgumentParser:
    from oscarkv.cli_commands import COMMANDS

    p = argparse.ArgumentParser(prog="oscarkv", description="INT2 KV cache with offline attention-aware rotations (OSCAR).")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (setup, _) in COMMANDS.items():
        setup(sub.add_parser(name, help=setup.__doc__, description=setup.__doc__))
    return p


def main(argv: list[str] | None = None) -> int:
    from oscarkv.cli_commands import COMMANDS, UserError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    try:
        return COMMANDS[args.command][1](args) or 0
    except UserError as e:
        print(f"oscarkv {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
