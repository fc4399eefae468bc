"""ARCHITECTURE.md's Arrows table is the rule, read from the document itself: every import of every module (module
level and inside functions, read with `ast`) is an arrow the table allows, and no two modules import each other
round a circle. So the document cannot go stale without this test failing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("app", "ui", "interp", "zoo", "saes", "riebench", "flowlens", "experiments", "benchmarks")
# The one circle the document allows, with its reason (the study's cells fingerprint its own source).
ALLOWED_CIRCLES = [{"experiments.smollm2_study", "experiments.smollm2_report"}]


def arrows_table(text: str) -> dict[str, set[str]]:
    """{module prefix: the prefixes it may import}, from the table under `## Arrows`."""
    section = text.split("\n## Arrows\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or not cells[0].startswith("`"):
            continue
        source = re.findall(r"`([\w.]+)`", cells[0])
        assert len(source) == 1, f"a row names one module: {line}"
        assert source[0] not in rows, f"two rows for {source[0]}"
        rows[source[0]] = set(re.findall(r"`([\w.]+)`", cells[1]))
    return rows


def project_modules() -> dict[str, Path]:
    modules = {"app": ROOT / "app.py"}
    for top in CHECKED[1:]:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (`from pkg import submodule` names the submodule)."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `from interp.models.t2i import X` -> interp.models.t2i
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def row_of(name: str, rows: dict[str, set[str]]) -> str | None:
    matching = [prefix for prefix in rows if under(name, prefix)]
    return max(matching, key=len) if matching else None


@pytest.fixture(scope="module")
def graph():
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


@pytest.fixture(scope="module")
def rows():
    return arrows_table((ROOT / "ARCHITECTURE.md").read_text())


def test_every_import_is_an_arrow_the_document_allows(graph, rows):
    unruled = sorted(name for name in graph if row_of(name, rows) is None)
    assert not unruled, f"modules no row of ARCHITECTURE.md's Arrows table governs: {unruled}"
    wrong = [f"{name} -> {target} (row `{row_of(name, rows)}`)" for name, targets in sorted(graph.items())
             for target in sorted(targets) if not any(under(target, allowed) for allowed in rows[row_of(name, rows)])]
    assert not wrong, "imports ARCHITECTURE.md's Arrows table does not allow:\n" + "\n".join(wrong)


def test_every_row_names_modules_that_exist(graph, rows):
    """A row about a module that is gone, or allowing one that is, is stale."""
    named = set(rows) | set().union(*rows.values())
    stale = sorted(prefix for prefix in named if not any(under(module, prefix) for module in graph))
    assert not stale, f"ARCHITECTURE.md's Arrows table names modules that do not exist: {stale}"


def test_the_core_never_imports_zoo_or_anything_above_it(graph):
    """Stated outright, beside the table: only the core's entry point imports zoo (to register it)."""
    above = ("zoo", "saes", "riebench", "flowlens", "ui", "app", "experiments", "benchmarks")
    hits = [f"{name} -> {target}" for name, targets in graph.items() if under(name, "interp")
            for target in targets if any(under(target, top) for top in above) and name != "interp.__main__"]
    assert not hits, hits


def test_no_import_circles(graph):
    """Tarjan's strongly connected components of the import graph: none of two or more modules but the allowed."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert [c for c in circles if c not in ALLOWED_CIRCLES] == []


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The reader is not blind to what the table is about: a function's relative import is an arrow."""
    package = tmp_path / "interp" / "hooks"
    package.mkdir(parents=True)
    (package / "lm.py").write_text("def f():\n    from ..models import lm\n    from . import scoped\n")
    modules = {"interp.hooks.lm": package / "lm.py", "interp.models": None, "interp.models.lm": None,
               "interp.hooks": None, "interp.hooks.scoped": None}
    assert imports_of("interp.hooks.lm", package / "lm.py", modules) == {"interp.models.lm", "interp.hooks.scoped"}
    table = arrows_table("# x\n## Arrows\n| `a.b` | `c`, `d.e` | why |\n|---|---|---|\n## Next\n| `z` | `y` | |\n")
    assert table == {"a.b": {"c", "d.e"}}


def test_the_benchmarks_that_patch_sys_path_are_the_ones_the_layout_names():
    """The Layout's benchmarks/ entry names the scripts that put the repository on sys.path; no other does."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    entry = text.split("\nbenchmarks/ ", 1)[1].split("\ntests/ ", 1)[0]
    named = set(re.findall(r"([\w]+\.py)", entry))
    patching = {p.name for p in (ROOT / "benchmarks").glob("*.py") if "sys.path" in p.read_text()}
    assert named == patching


# Tests of a model's identity by its name, which the spec decides once (`interp.models.spec.model_spec`: kind,
# source, registry entry, world, defaults): the core and the packages above it ask the spec, never the name.
CORE = ("interp", "saes", "ui", "riebench", "flowlens", "app.py")
NAME_TESTS = re.compile(r"""startswith\(\s*["']toy|["']turbo["']\s+in\b|["']/["']\s+in\s+model_name"""
                        r"""|==\s*["']toy-chat["']""")


def test_the_core_tests_no_model_by_its_name():
    hits = []
    for top in CORE:
        paths = [ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py"))
        for path in paths:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if NAME_TESTS.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "a model's kind or defaults decided by its name (ask interp.models.spec.model_spec):\n" + \
        "\n".join(hits)


@pytest.mark.parametrize("line", ['if name.startswith("toy-chat"):', "steps = 1 if 'turbo' in source else 30",
                                  'if "/" in model_name:', 'text == "toy-chat" or x'])
def test_the_name_test_search_sees_the_forms_it_forbids(line):
    assert NAME_TESTS.search(line)
