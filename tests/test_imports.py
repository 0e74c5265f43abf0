"""The layers of app/ (docs/architecture.md): every module in one layer, and no import of a layer above its
own (counting imports inside functions and under TYPE_CHECKING); and no import cycles among app/'s
modules. Found by reading the sources with `ast` (nothing is imported).

For the cycles:

Counted: module-level imports, i.e. every import that runs while the module loads (top level, and under
top-level if / try / with blocks and class bodies). Not counted: imports inside functions (lazy imports:
they run when called, after every module has loaded) and imports under `if TYPE_CHECKING:`.

Edges: `import a.b` -> a.b; `from a.b import c` -> a.b.c when that is a module, else a.b; relative
imports are resolved against the importing module's package. The parent packages an import also
initialises are not edges: a package's __init__ importing its submodules while they import their siblings
from the package is Python's ordinary layout, not a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (a folder under `root`): dotted name -> file."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(nodes: Iterable[ast.AST], lazy: bool, typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """`lazy`: imports inside functions too; `typing`: those under TYPE_CHECKING too (the layer order)."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not lazy:
            continue
        elif isinstance(node, ast.If) and _type_checking(node.test) and not typing:
            yield from _imports(node.orelse, lazy, typing)
        else:
            yield from _imports(ast.iter_child_nodes(node), lazy, typing)


def import_graph(root: Path, package: str, lazy: bool = False, typing: bool = False) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports at module level (`lazy`: inside functions too;
    `typing`: under TYPE_CHECKING too)."""
    files = module_files(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]  # the module's package
        edges = graph.setdefault(name, set())
        for node in _imports(ast.parse(path.read_text(), str(path)).body, lazy, typing):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
                continue
            base = node.module or ""
            if node.level:
                pkg = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{pkg}.{base}" if base else pkg
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in files:
                    edges.add(target)
                elif base in files:
                    edges.add(base)
    return graph


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One shortest cycle ([a, b, ..., a]) per strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:
        start = min(component)
        if len(component) == 1 and start not in graph.get(start, ()):
            continue
        # breadth-first from start back to start, inside the component: the shortest such cycle
        parent: dict[str, str] = {}
        frontier = [start]
        while start not in parent:
            reached = []
            for v in frontier:
                for w in sorted(graph.get(v, ())):
                    if w in component and w not in parent:
                        parent[w] = v
                        reached.append(w)
            frontier = reached
        path = [start]  # walked backwards: start <- parent[start] <- ... <- start
        while True:
            path.append(parent[path[-1]])
            if path[-1] == start:
                break
        cycles.append(path[::-1])
    return sorted(cycles)


def test_cycle_finder_on_synthetic_graphs():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"x": {"x"}, "y": {"x"}}) == [["x", "x"]]
    # two components; the shortest cycle through the first name is reported, not the long way round
    graph = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "p": {"q"}, "q": {"p"}, "z": {"p"}}
    assert find_cycles(graph) == [["a", "d", "a"], ["p", "q", "p"]]


def test_import_graph_counts_module_level_imports_only(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg import a\n",
        "a.py": "import os\nfrom pkg import b\nfrom . import sub\nfrom .sub.leaf import VALUE\n"
        "try:\n    import pkg.c\nexcept ImportError:\n    pass\n",
        "b.py": "def f():\n    from pkg import a  # lazy: runs after everything loaded\n    return a\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
        "class K:\n    from pkg.sub import leaf\n",
        "sub/__init__.py": "",
        "sub/leaf.py": "from .. import b\nVALUE = 1\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub", "pkg.sub.leaf", "pkg.c"},
        "pkg.b": set(),
        "pkg.c": {"pkg.sub.leaf"},
        "pkg.sub": set(),
        "pkg.sub.leaf": {"pkg.b"},
    }
    assert find_cycles(graph) == []
    lazy = import_graph(tmp_path, "pkg", lazy=True)
    assert lazy["pkg.b"] == {"pkg.a"} and find_cycles(lazy) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert lazy["pkg.c"] == {"pkg.sub.leaf"}
    everything = import_graph(tmp_path, "pkg", lazy=True, typing=True)  # what the layer order counts
    assert everything["pkg.c"] == {"pkg.a", "pkg.sub.leaf"}


def test_app_has_no_module_level_import_cycles():
    cycles = find_cycles(import_graph(ROOT, "app"))
    assert not cycles, "module-level import cycles in app/:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_app_has_no_import_cycles_hidden_in_functions():
    """A lazy import that closes a loop still ties two modules into one: the layering is what is
    checked here (the CUDA backend, its launch policies and the tuner were such a loop)."""
    cycles = find_cycles(import_graph(ROOT, "app", lazy=True))
    assert not cycles, "import cycles in app/ (counting imports inside functions):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_app_has_no_import_cycles_even_through_type_hints():
    """Nor through imports made only for the type checker: model's bodies -> components -> config ->
    physics -> bodies was such a loop (the physics' names now live in the settings table)."""
    cycles = find_cycles(import_graph(ROOT, "app", lazy=True, typing=True))
    assert not cycles, "import cycles in app/ (counting lazy and TYPE_CHECKING imports):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


# --- the layers, top to bottom (docs/architecture.md "Layers"): a module may import its own layer and those
# below it. A module is in the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry", ("app.cli", "app.__main__", "app.commands")),
    ("ui", ("app.ui",)),
    ("render", ("app.render",)),
    ("tools", ("app.tools",)),
    ("scene", ("app.scene",)),
    ("runs", ("app.backends",)),
    ("parallel", ("app.parallel",)),
    ("engine", ("app.engine",)),
    ("model", ("app.model",)),
    ("core", ("app", "app.core")),
)


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index of the layer whose longest prefix names `module` (0: the top), or None."""
    best, length = None, -1
    for index, (_name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    return best


def upward_imports(graph: Mapping[str, Iterable[str]], layers=LAYERS) -> list[str]:
    """Every import of a module in a layer above the importer's, as 'a (layer) -> b (layer)'."""
    found = []
    for module in sorted(graph):
        here = layer_of(module, layers)
        for target in sorted(graph[module]):
            there = layer_of(target, layers)
            if here is not None and there is not None and there < here:
                found.append(f"{module} ({layers[here][0]}) -> {target} ({layers[there][0]})")
    return found


def test_every_module_of_app_is_in_a_layer():
    unplaced = [m for m in module_files(ROOT, "app") if layer_of(m) is None]
    assert not unplaced, f"put these in a layer of tests/test_imports.py LAYERS: {unplaced}"


def test_no_module_imports_a_layer_above_its_own():
    found = upward_imports(import_graph(ROOT, "app", lazy=True, typing=True))
    assert not found, "imports up the layer order (docs/architecture.md):\n" + "\n".join(found)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """A test of the test: a low module importing a high one, inside a function or under TYPE_CHECKING,
    is reported; the same import downwards is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    layers = (("top", ("pkg.top",)), ("low", ("pkg", "pkg.low")))
    (pkg / "__init__.py").write_text("")
    (pkg / "top.py").write_text("from pkg import low\n")
    (pkg / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pkg import top\ndef f():\n    from pkg.top import X\n"
    )
    graph = import_graph(tmp_path, "pkg", lazy=True, typing=True)
    assert upward_imports(graph, layers) == ["pkg.low (low) -> pkg.top (top)"]
    for alone in (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import top\n",
        "def f():\n    from pkg.top import X\n",
    ):
        (pkg / "low.py").write_text(alone)
        assert upward_imports(import_graph(tmp_path, "pkg", lazy=True, typing=True), layers), alone
    (pkg / "low.py").write_text("X = 1\n")
    assert upward_imports(import_graph(tmp_path, "pkg", lazy=True, typing=True), layers) == []
