"""The package's shape: no import circle inside it, executor modules that import without sqlalchemy,
and empty package __init__ files (docs/development.md#layout)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from ledgerbatch.spark.package import PACKAGE_DIR

# What Spark tasks import: executors have the package's zip, pyarrow, numpy, psycopg2 and confluent-kafka, not sqlalchemy.
EXECUTOR_MODULES = ["model", "source.reader", "source.together", "formats", "stage.job", "stage.csv_copy",
                    "stage.binary_copy", "stage.tasks", "stage.turn_tasks", "stage.stamps", "stage.warm_tasks"]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a function."""
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name and not modules[t].name == "__init__.py")
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_inside_the_package():
    graph = import_graph()
    assert len(graph) > 50 and graph["ledgerbatch.cli"], "the graph must see the package's modules and imports"
    assert import_circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_executor_modules_import_without_sqlalchemy():
    modules = _modules()
    wanted = sorted(m for m in modules for prefix in EXECUTOR_MODULES
                    if m == f"ledgerbatch.{prefix}" or m.startswith(f"ledgerbatch.{prefix}."))
    assert "ledgerbatch.formats.decoders.avro" in wanted and "ledgerbatch.stage.tasks" in wanted
    code = ("import importlib, sys\nsys.modules['sqlalchemy'] = None\n"
            f"for name in {wanted!r}:\n    importlib.import_module(name)\n"
            "assert not [m for m in sys.modules if m.startswith('sqlalchemy.')]\nprint('ok', len(" + repr(wanted) + "))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE_DIR.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"ok {len(wanted)}"


def test_package_init_files_are_empty():
    assert [str(p) for p in PACKAGE_DIR.rglob("__init__.py") if p.read_text().strip()] == []
