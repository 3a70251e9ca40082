"""The ``oscarkv`` command: one subcommand per file of this folder.

Each subcommand module has ``setup(parser)`` (flags; no heavy imports, so ``--help`` answers
without torch) and ``run(args) -> int`` (imports what it needs, does one job). A
:class:`~oscarkv.cli.flags.UserError` is reported as ``oscarkv CMD: error: ...`` with exit
status 2, the config fields it names said as the command's flags (``in_flag_words``). Nothing else in ``oscarkv`` imports this folder.
"""

from __future__ import annotations

import argparse
import logging
import sys

from oscarkv.cli import bench, calibrate, demo, evaluate, export_rotations, generate, import_rotations, report, serve
from oscarkv.cli.flags import UserError, flag_names, in_flag_words
from oscarkv.config import __version__

COMMANDS = {"demo": demo, "calibrate": calibrate, "eval": evaluate, "report": report,
            "generate": generate, "serve": serve, "bench": bench,
            "import-rotations": import_rotations, "export-rotations": export_rotations}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oscarkv", description="INT2 KV cache with offline attention-aware rotations (OSCAR).")
    p.add_argument("--version", action="version", version=f"oscarkv {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, mod in COMMANDS.items():
        doc = mod.setup.__doc__
        mod.setup(sub.add_parser(name, help=doc, description=doc))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    try:
        return COMMANDS[args.command].run(args) or 0
    except UserError as e:
        print(f"oscarkv {args.command}: error: {in_flag_words(str(e), flag_names(parser, args.command))}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
