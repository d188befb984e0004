"""The package's layers as docs/design.md draws them, held against the code's own imports (those inside
functions too): no module imports from a layer above its own, and no import cycle."""

import ast
import re
from pathlib import Path

from .conftest import ROOT

PACKAGE = ROOT / "evalpipe"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The evalpipe modules `name` imports, anywhere in it."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin for a in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != name:
                found.add(target)
    return found


def drawn_layers() -> list[list[str]]:
    """design.md's layer block, top line first: each line's folders (`stages/`) and root modules (`cli`)."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"<!-- layers: top to bottom -->\n```text\n(.*?)```", text, re.S)
    assert block, "docs/design.md has no layer block"
    return [line.split("|")[0].split() for line in block.group(1).splitlines() if line.strip()]


def layer_of(name: str, layers: list[list[str]]) -> int | None:
    """Which line of the drawing (0 = top) a module belongs to; the package's __init__ is under them all."""
    if name == "evalpipe":
        return len(layers)
    first = name.split(".")[1]
    for depth, places in enumerate(layers):
        if f"{first}/" in places or (first in places and name.count(".") == 1):
            return depth
    return None


def test_every_module_has_a_layer_and_imports_only_its_own_and_lower_ones():
    layers = drawn_layers()
    unplaced = sorted(n for n in MODULES if layer_of(n, layers) is None)
    assert not unplaced, f"modules on no line of design.md's layers: {unplaced}"
    depth = {name: layer_of(name, layers) for name in MODULES}
    upward = [
        f"{name} (line {depth[name]}) imports {target} (line {depth[target]})"
        for name in sorted(MODULES)
        for target in sorted(imports_of(name))
        if depth[target] < depth[name]
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)
    root_modules = [p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    assert len(root_modules) <= 10, root_modules


def test_no_import_cycle():
    graph = {name: imports_of(name) for name in MODULES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name) :] + [name]))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_the_client_is_handed_plain_values_never_the_command_line():
    """client/ is below the stages' flags: it imports no argparse, takes no parameter named `args`, and reads no
    `args.` attribute; a stage turns its flags into values (runner.Settings, amounts, paths) once."""
    found = []
    for name, path in sorted(MODULES.items()):
        if not name.startswith("evalpipe.client."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(m.split(".")[0] == "argparse" for m in modules):
                    found.append(f"{name}:{node.lineno} imports argparse")
            elif isinstance(node, ast.arg) and node.arg == "args":
                found.append(f"{name}:{node.lineno} takes a parameter `args`")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
                found.append(f"{name}:{node.lineno} reads args.{node.attr}")
    assert not found, "client/ sees the command line:\n" + "\n".join(found)
