"""Small modules with one job: no module of app/ over MAX_MODULE_LINES lines and no function over
MAX_FUNCTION_LINES, except those named, with their reasons, in docs/architecture.md's "Size exceptions"
table (one row per exception: `| path or path::function | why |`). An exception that is back under its
limit fails too, so the table never outlives its reason. Read with `ast`: nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def oversized(root: Path, package: str = "app") -> set[str]:
    """`path` of each module over the module limit and `path::qualified.name` of each function over
    the function limit (a method: `Class.method`; a nested function: `outer.inner`)."""
    found = set()
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.add(rel)
        found |= {f"{rel}::{name}" for name in _long_functions(ast.parse(text), "")}
    return found


def _long_functions(node: ast.AST, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                assert child.end_lineno is not None
                if child.end_lineno - child.lineno + 1 > MAX_FUNCTION_LINES:
                    yield name
            yield from _long_functions(child, f"{name}.")
        else:
            yield from _long_functions(child, prefix)


def named_exceptions(doc: str) -> dict[str, str]:
    """The rows of the "Size exceptions" table of `doc` (architecture.md's text): where -> why."""
    section = doc.split("### Size exceptions", 1)
    if len(section) < 2:
        return {}
    rows = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("|") else None
        if match and len(cells) >= 2:
            rows[match.group(1)] = cells[1]
    return rows


def test_no_module_or_function_over_its_limit_except_the_named_ones():
    exceptions = named_exceptions((ROOT / "docs" / "architecture.md").read_text())
    found = oversized(ROOT)
    unnamed = sorted(found - set(exceptions))
    assert not unnamed, (
        f"over {MAX_MODULE_LINES} lines (a module) or {MAX_FUNCTION_LINES} (a function): {unnamed}; split "
        "them, or name each with its reason in docs/architecture.md's 'Size exceptions'"
    )
    stale = sorted(set(exceptions) - found)
    assert not stale, f"named as size exceptions but within the limits (remove their rows): {stale}"
    assert all(exceptions.values()), "every size exception says why"


def test_the_size_check_finds_a_long_module_and_a_long_method(tmp_path):
    """The check itself: a module over the limit, a long method and a long nested function are found,
    a short function is not; the table's rows are read."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text(
        f"class A:\n    def method(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n\n"
        f"def outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n    return inner\n\n"
        + "\n"
        * MAX_MODULE_LINES
    )
    (tmp_path / "pkg" / "short.py").write_text("def f():\n    return 1\n")
    assert oversized(tmp_path, "pkg") == {
        "pkg/long.py",
        "pkg/long.py::A.method",
        "pkg/long.py::outer",
        "pkg/long.py::outer.inner",
    }
    doc = (
        "# A\n### Size exceptions\n\n| where | why |\n|---|---|\n| `pkg/long.py` | a reason |\n"
        "## Next\n| `x` | y |"
    )
    assert named_exceptions(doc) == {"pkg/long.py": "a reason"}
