"""sageattention's modules import one way: each layer only from the layers below it (imports inside
functions count as well). The layers, bottom first, are in LAYERS; docs/architecture.md draws them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sageattention"

#: Bottom first. A module may import its own layer's modules only where listed in SAME_LAYER.
LAYERS = [
    {"quant"},  # the quantization's constants and options
    {"_checks", "reference"},  # argument checks, the float64 and simulated references
    {"_cabi", "_native"},  # the compiled modules' C ABI (ctypes): its package-neutral half, sageattention's
    {"cuda_ops"},  # their torch ops
    {"extensions"},  # what is built and loadable, GPU facts
    {"cuda_common", "cuda_sm80", "cuda_sm89", "cuda_sm90", "triton"},  # the kernels' launchers
    {"ops"},  # the backends' entry points (compiled, Triton, torch SDPA)
    {"dispatch"},  # which backend serves a call
    {"autograd"},  # the backward
    {"core", "merge"},  # the public functions
    {"__init__", "__main__", "integrations"},  # the package, its command line, the integrations
]
SAME_LAYER = {("cuda_sm80", "cuda_common"), ("cuda_sm89", "cuda_common"), ("cuda_sm90", "cuda_common"),
              ("cuda_sm89", "cuda_sm80"), ("__main__", "integrations"), ("_native", "_cabi"),
              ("__init__", "integrations")}  # fmt: skip


def _unit(module: str) -> str:
    """The layer unit of a dotted module inside the package: its first component (subpackages are one)."""
    return module.split(".")[0]


def _imports(path: Path) -> set[str]:
    """The package modules (relative to the package, dotted) that ``path`` imports anywhere in it."""
    here = list(path.relative_to(PACKAGE).parts[:-1])  # the module's package, relative to sageattention
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                prefix = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.split(".")[0] == "sageattention":
                prefix = node.module.partition(".")[2]
            else:
                continue
            if node.module is None or not prefix:  # `from . import a, b`: the names are modules
                for alias in node.names:
                    found.add(f"{prefix}.{alias.name}" if prefix else alias.name)
            else:
                found.add(prefix)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sageattention" and "." in alias.name:
                    found.add(alias.name.partition(".")[2])
    # `from . import name` and `from sageattention import name` name modules or other objects: modules only
    return {m for m in found if m and _is_module(m)}


def _is_module(dotted: str) -> bool:
    path = PACKAGE.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        unit = rel.parts[0] if len(rel.parts) > 1 else rel.name
        graph.setdefault(unit, set()).update(_unit(m) for m in _imports(path) if _unit(m) != unit)
    return graph


def _rank(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"sageattention/{unit}: in no layer of tests/unit/test_layers.py LAYERS")


def test_every_import_goes_down():
    wrong = []
    for unit, deps in _graph().items():
        for dep in deps:
            if _rank(dep) > _rank(unit) or (_rank(dep) == _rank(unit) and (unit, dep) not in SAME_LAYER):
                wrong.append(f"{unit} -> {dep}")
    assert not wrong, "imports against the layers: " + ", ".join(sorted(wrong))


def test_no_import_circle():
    graph, state, path = _graph(), {}, []

    def visit(unit):
        state[unit] = "open"
        path.append(unit)
        for dep in sorted(graph.get(unit, ())):
            if state.get(dep) == "open":
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(dep) :], dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[unit] = "done"

    for unit in sorted(graph):
        if unit not in state:
            visit(unit)


def test_the_scan_sees_the_imports():
    """The scan finds imports inside functions and of both forms (a scan that saw none would pass)."""
    graph = _graph()
    assert {"cuda_sm80", "cuda_sm89", "cuda_sm90", "extensions"} <= graph["ops"]
    assert "triton" in graph["autograd"]  # a function-level import
    assert "cuda_ops" in graph["triton"]  # `from .. import cuda_ops` inside a function of triton/launch
