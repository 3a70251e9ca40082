"""The one runner interface (``oscarkv.engine.runner.Runner``): every runner class declares its methods with the
interface's signatures, a built runner has every member, and nothing in the package replaces an engine's runner
after construction (a bench wrapper swapped in at run time once hid a missing method until a two-GPU job ran)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from oscarkv.bench.e2e import BenchRunner, bench_engine
from oscarkv.engine.model_runner import ModelRunner
from oscarkv.engine.runner import Runner
from oscarkv.engine.workers import ParallelRunner
from oscarkv.models.llama import PagedLM
from tests.engine.conftest import engine_config, make_engine

ROOT = Path(__file__).resolve().parents[2] / "oscarkv"
METHODS = ("run", "failure", "close")


def _params(fn) -> list[tuple[str, object, object]]:
    """Name, kind and default of each parameter (annotations are strings under ``from __future__``)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", [ModelRunner, ParallelRunner, BenchRunner])
def test_each_runner_class_has_the_interface_signatures(cls):
    for name in METHODS:
        assert _params(getattr(cls, name)) == _params(getattr(Runner, name)), f"{cls.__name__}.{name}"
        assert inspect.signature(getattr(cls, name)).return_annotation == \
            inspect.signature(getattr(Runner, name)).return_annotation, f"{cls.__name__}.{name} returns"


def test_built_runners_have_every_member(llama):
    """A ModelRunner and a BenchRunner around it (the ParallelRunner: ``tests/bench/test_job_through_two_ranks``);
    the wrapper's members are its inner runner's, and it runs a request to the same tokens."""
    from oscarkv.engine.request import SamplingParams

    members = [n for n in Runner.__annotations__] + list(METHODS)
    plain = make_engine(llama, "bf16")
    wrapped = bench_engine(PagedLM.from_hf(llama), engine_config("bf16"))
    assert isinstance(plain.runner, ModelRunner) and isinstance(plain.runner, Runner)
    assert isinstance(wrapped.runner, BenchRunner) and isinstance(wrapped.runner, Runner)
    assert all(hasattr(plain.runner, m) and hasattr(wrapped.runner, m) for m in members)
    for m in Runner.__annotations__:
        assert getattr(wrapped.runner, m) is getattr(wrapped.runner.inner, m)
    sp = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = []
    for engine in (plain, wrapped):
        engine.add_request("a", list(range(3, 40)), sp)
        while engine.has_unfinished():
            outs += [o.token_ids for o in engine.step() if o.finished]
    assert outs[0] == outs[1] and len(outs[0]) == 6 and len(wrapped.runner.launches) == 6


def test_nothing_replaces_an_engines_runner():
    """``X.runner = ...`` appears in the package only as an object's own ``self.runner`` in its ``__init__``
    (``LLMEngine``'s, and the CUDA graphs' reference to their runner)."""
    found = []
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for t in targets:
                    for a in ast.walk(t) if t is not None else ():
                        if isinstance(a, ast.Attribute) and a.attr == "runner" and isinstance(a.ctx, ast.Store):
                            found.append((path.relative_to(ROOT).as_posix(), fn.name, ast.unparse(a.value)))
    assert ("engine/engine.py", "__init__", "self") in found
    assert {(fn, obj) for _, fn, obj in found} == {("__init__", "self")}, found
