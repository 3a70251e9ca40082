"""Every ``@triton.jit`` function in ``oscarkv`` (the kernels, the attention backends) stays within what Triton 3.6 can compile.

The GPU machines and many users run Triton 3.6 (with torch 2.11); the local venv has a newer Triton that
accepts more. This walks the source (no compiler, milliseconds) and rejects the constructs 3.6 is known to
refuse, each with the reason, so a kernel change that only a newer Triton compiles fails on the CPU in CI.
``python -m lab.benchmarks.compile_sm90 --table`` with Triton 3.6 on the path is the full check.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "oscarkv"
JIT_FILES = sorted(p for p in PACKAGE.rglob("*.py") if "triton.jit" in p.read_text())


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and d.attr == "jit" or isinstance(d, ast.Name) and d.id == "jit":
            return True
    return False


def _nested_target(target: ast.expr) -> bool:
    """``(a, b), c = ...``: a tuple target holding a tuple or list."""
    return isinstance(target, (ast.Tuple, ast.List)) and any(
        isinstance(e, (ast.Tuple, ast.List, ast.Starred)) for e in target.elts)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)):
        return [node.target]
    return []


def violations(source: str, filename: str) -> list[str]:
    """``file:line: function: reason`` for each construct Triton 3.6 cannot compile in a jit function."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not (isinstance(fn, ast.FunctionDef) and _is_jit(fn)):
            continue
        for node in ast.walk(fn):
            for t in _targets(node):
                if _nested_target(t):
                    out.append(f"{filename}:{node.lineno}: {fn.name}: nested tuple assignment target "
                               f"`{ast.unparse(t)}` (Triton 3.6's dependency finder raises TypeError: unhashable "
                               "type 'list'); unpack in two steps")
    return out


@pytest.mark.parametrize("path", JIT_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_kernels_compile_with_triton_36(path):
    found = violations(path.read_text(), str(path.relative_to(PACKAGE)))
    assert not found, "Triton 3.6 compatibility:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet, bad", [
    ("(a, b), c = t", True),
    ("a, (b, c) = t", True),
    ("for (i, j), k in z: pass", True),
    ("a, b = t", False),
    ("(a, b) = t", False),
])
def test_guard_catches_nested_targets(snippet, bad):
    body = "\n".join("    " + line for line in snippet.splitlines())
    assert bool(violations(f"@triton.jit\ndef f(t, z):\n{body}\n", "x.py")) is bad
