"""The package's layers import only downward, and only `gpuopt._ext` imports the compiled module.

Read from the source with `ast` (no import needed), so it runs anywhere. The order is the architecture
written in `gpuopt/__init__.py` and the README.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "gpuopt"

# Lower number = lower layer. A module may import from its own layer and any lower one.
LAYERS = {
    "_ext": 0, "_files": 0, "_checks": 0, "_C": 0,
    "timing": 1,
    "memory": 2,
    "quant": 2,  # quantized layers: what the prepare layer's fp8/int8 precisions put into a model
    "prepare": 3,
    "analysis": 4,
    "report": 5,
    "run": 6,
    # engines built on run/ (and below)
    "serving": 8, "llm": 8, "dist": 9, "optimizer": 10,
    "testing": 11, "pytest": 12, "cli": 12, "__main__": 13, "__init__": 13,
}


def _layer_of(parts: tuple[str, ...]) -> str:
    return parts[0] if parts else "__init__"


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, target module path inside gpuopt) of every gpuopt import in the file, relative or absolute."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    package = rel[:-1] if rel[-1] != "__init__" else rel[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = base + tuple(node.module.split(".")) if node.module else base
                if not node.module:  # from . import x, y: each name is a module
                    out += [(node.lineno, target + (a.name,)) for a in node.names]
                    continue
            elif node.module and node.module.split(".")[0] == "gpuopt":
                target = tuple(node.module.split(".")[1:])
            else:
                continue
            out.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, tuple(a.name.split(".")[1:])) for a in node.names
                    if a.name.split(".")[0] == "gpuopt"]
    return out


def test_every_module_belongs_to_a_known_layer():
    unknown = sorted({_layer_of(p.relative_to(PACKAGE).with_suffix("").parts) for p in _modules()} - set(LAYERS))
    assert not unknown, f"add these to LAYERS (and to the README's layer list): {unknown}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_downward(path):
    own = _layer_of(path.relative_to(PACKAGE).with_suffix("").parts)
    upward = []
    for line, target in _imports(path):
        layer = _layer_of(target)
        if layer not in LAYERS:
            upward.append(f"line {line}: unknown layer {layer!r} ({'.'.join(target)})")
        elif LAYERS[layer] > LAYERS[own]:
            upward.append(f"line {line}: {own} imports {'.'.join(target)} (layer {layer}, above it)")
    assert not upward, "\n".join(upward)


def test_only_ext_imports_the_compiled_module():
    offenders = []
    for path in _modules():
        if path.name == "_ext.py":
            continue
        for line, target in _imports(path):
            if target and target[0] == "_C":
                offenders.append(f"{path.relative_to(PACKAGE)}:{line}")
    assert not offenders, f"import _C through gpuopt._ext only: {offenders}"


@pytest.mark.parametrize("package", sorted({p.parent for p in _modules()}), ids=lambda p: p.name)
def test_no_function_shadows_a_module_of_the_same_name(package):
    # `from .ceilings import ceilings` in a package makes `pkg.ceilings` the function, and
    # `from pkg import ceilings` (meaning the module) silently gets it: it broke the runner once.
    import importlib
    import inspect

    name = ".".join(("gpuopt", *package.relative_to(PACKAGE).parts))
    module = importlib.import_module(name)
    clashes = [attr for attr, value in vars(module).items()
               if not attr.startswith("_") and (inspect.isfunction(value) or inspect.isbuiltin(value))
               and ((package / f"{attr}.py").exists() or (package / attr / "__init__.py").exists())]
    assert not clashes, f"{name}.{clashes} are functions with a module of the same name beside them"
