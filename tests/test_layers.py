"""The import layers of ``oscarkv`` (docs/DESIGN.md §5): every import, at module level or inside a
function, points down the layer order, and no modules import each other in a circle.

Bottom to top: ``{config, data} < quant < cache < kernels < attention < models < {engine, calibrate}
< {eval, server, bench} < llm < cli``; folders inside one ``{}`` do not import each other. The
package's face (``oscarkv/__init__.py``) sits above everything and nothing inside imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "oscarkv"
LAYERS = [{"config", "data"}, {"quant"}, {"cache"}, {"kernels"}, {"attention"}, {"models"},
          {"engine", "calibrate"}, {"eval", "server", "bench"}, {"llm"}, {"cli"}, {""}]
RANK = {name: i for i, group in enumerate(LAYERS) for name in group}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Every ``oscarkv`` module that ``path`` imports, wherever the import statement stands."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in out if m == "oscarkv" or m.startswith("oscarkv.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}

    def resolve(name: str) -> str:  # `from oscarkv.x import y` names a module or an attribute of one
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    return {m: {resolve(t) for t in imports(p, set(modules))} - {m} for m, p in modules.items()}


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_imports_point_down():
    bad = []
    for src, targets in graph().items():
        for dst in targets:
            a, b = layer(src), layer(dst)
            if a != b and RANK[b] >= RANK[a]:
                bad.append(f"{src} -> {dst}")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(bad))


def test_every_folder_has_a_layer():
    assert {layer(m) for m in graph()} <= set(RANK)


def test_no_import_circles():
    edges, state, circles = graph(), {}, []

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for t in sorted(edges[m]):
            if state.get(t) == "open":
                circles.append(" -> ".join(path[path.index(t):] + [m, t]) if t in path else f"{m} -> {t}")
            elif t not in state:
                visit(t, path + [m])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    assert not circles, "import circles:\n" + "\n".join(circles)
