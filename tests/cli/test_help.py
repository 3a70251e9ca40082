"""Every ``oscarkv`` (sub)command's ``--help``: it parses, reads as plain text, shows every default as
it would be typed, and ``oscarkv --help`` answers without importing torch."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oscarkv.cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name (``serve``, ``bench decode``, ...), the top one as ``oscarkv``."""
    out, todo = {}, [("oscarkv", build_parser())]
    while todo:
        name, p = todo.pop()
        out[name] = p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [(f"{name} {sub}".removeprefix("oscarkv "), sp) for sub, sp in a.choices.items()]
    return out


PARSERS = parsers()


def test_every_command_and_bench_is_covered():
    from oscarkv.cli.bench import BENCHES

    assert set(COMMANDS) | {f"bench {b}" for b in BENCHES} | {"oscarkv"} == set(PARSERS)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_parses_and_is_plain(name, capsys):
    argv = [] if name == "oscarkv" else name.split()
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*argv, "--help"])
    text = capsys.readouterr().out
    assert done.value.code == 0 and text.startswith("usage: oscarkv")
    assert "``" not in text and not re.search(r":[a-z]+:`", text), text


def options(p: argparse.ArgumentParser):
    skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return [a for a in p._actions if a.option_strings and not isinstance(a, skip) and not a.required]


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_default_is_shown_as_typed(name):
    """Each optional flag's help ends with ``(... default: X)``, and ``X`` typed back gives the default."""
    for a in options(PARSERS[name]):
        if a.dest == "verbose":  # -v/--verbose: a switch with nothing to show
            continue
        m = re.search(r"default: (.*)\)$", " ".join((a.help or "").split()))
        assert m, f"oscarkv {name} {a.option_strings[-1]}: no default in its help: {a.help!r}"
        shown = m.group(1)
        if isinstance(a, argparse.BooleanOptionalAction):
            assert shown in a.option_strings or (a.default is None and shown == "auto"), (name, a.dest, shown)
            assert a.default is None or (shown == a.option_strings[0]) == a.default, (name, a.dest, shown)
        elif a.nargs == 0:  # store_true
            assert shown == ("on" if a.default else "off"), (name, a.dest, shown)
        elif a.default is not None:
            typed = a.type(shown) if a.type else shown
            assert typed == a.default, f"oscarkv {name} {a.option_strings[-1]}: shows {shown!r}, default {a.default!r}"


def test_help_does_not_import_torch():
    """``python -m oscarkv.cli --help`` and every subcommand's parser: torch never imported."""
    code = ("import sys; from oscarkv.cli.main import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    timed = subprocess.run([sys.executable, "-X", "importtime", "-m", "oscarkv.cli", "--help"], cwd=ROOT,
                           capture_output=True, text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in timed.stderr.splitlines() if "|" in line}
    assert "oscarkv.cli.main" in imported and not {m for m in imported if m.split(".")[0] == "torch"}
    assert timed.stdout.startswith("usage: oscarkv")
