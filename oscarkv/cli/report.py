"""``oscarkv report``: rebuild an eval run's tables and plots from its samples.jsonl."""

from __future__ import annotations

import argparse
from pathlib import Path

from oscarkv.cli.flags import UserError


def setup(p: argparse.ArgumentParser) -> None:
    """Rebuild results.json, results.md and plots of an eval run from its samples.jsonl (e.g. an interrupted run)."""
    p.add_argument("--run", type=Path, required=True, help="the eval --out directory holding samples.jsonl")


def run(args: argparse.Namespace) -> int:
    from oscarkv.eval.report import write_report
    from oscarkv.eval.runner import records_from_log

    log = args.run / "samples.jsonl"
    if not log.is_file():
        raise UserError(f"no samples.jsonl in {args.run}: point --run at an 'oscarkv eval --out' directory")
    lines = log.read_text().splitlines()
    meta = {"rebuilt_from": str(log), "samples_logged": sum(1 for line in lines if line.strip())}
    write_report(records_from_log(lines), args.run, meta)
    print((args.run / "results.md").read_text())
    return 0
