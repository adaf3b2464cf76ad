"""No import cycle between the top-level modules and subpackages of ``fairseq_idpg``, counting the imports a
module runs when it is imported and, apart, every import it holds (inside functions too: a cycle there works only
while the functions happen to run in one order, and a reader cannot tell the layers apart).

A module of unit A (``fairseq_idpg.A`` or a module under it) that imports from unit B when it is
imported (at module level, class bodies and top-level ``if``/``try`` included; not inside functions,
not under ``if TYPE_CHECKING``) is an edge A -> B; a cycle of such edges is an import circle that
only works while the modules happen to be imported in one order. The package's own ``__init__`` (the
user dir that imports what registers) is no unit. Read with ``ast``: nothing is imported.
"""

import ast
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "fairseq_idpg"

# Cycles between units accepted for now, as frozensets of unit names: none.
ALLOWED: Set[frozenset] = set()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_when_loaded(body):
    """The import statements a module body runs when it is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from imports_when_loaded(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    yield from imports_when_loaded(children)


def every_import(body):
    """Every import statement of a module, inside functions and methods included."""
    for node in ast.walk(ast.Module(body=list(body), type_ignores=[])):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def imported_modules(node, module: str, is_package: bool) -> List[str]:
    """The absolute names that ``node`` (in ``module``) imports from: for ``from P import x`` with P the
    package root, ``P.x`` (x may be a submodule), else the module named."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module if is_package else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    if base == module.split(".")[0]:
        return [f"{base}.{alias.name}" for alias in node.names]
    return [base]


def unit_edges(root: Path, imports=imports_when_loaded) -> Dict[Tuple[str, str], List[str]]:
    """{(unit A, unit B): ["path:line imports name", ...]} for the package at ``root``, of the import statements
    ``imports`` finds in each module's body."""
    package = root.name
    edges: Dict[Tuple[str, str], List[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        if module == package:
            continue
        unit = module.split(".")[1]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in imports(tree.body):
            for name in imported_modules(node, module, path.name == "__init__.py"):
                parts = name.split(".")
                if parts[0] == package and len(parts) > 1 and parts[1] != unit:
                    where = f"{path.relative_to(root.parent)}:{node.lineno} imports {name}"
                    edges.setdefault((unit, parts[1]), []).append(where)
    return edges


def cycles(edges) -> List[List[str]]:
    """The strongly connected components of more than one unit (Tarjan), each sorted."""
    graph: Dict[str, Set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(component, edges) -> str:
    inside = [(a, b) for a, b in edges if a in component and b in component]
    return "; ".join(f"{a} -> {b} ({edges[a, b][0]})" for a, b in sorted(inside))


def test_no_import_cycle_between_the_packages_units():
    edges = unit_edges(REPO / PACKAGE)
    found = [c for c in cycles(edges) if frozenset(c) not in ALLOWED]
    assert not found, "import cycles between units of fairseq_idpg: " + " | ".join(describe(c, edges) for c in found)


def test_no_import_cycle_between_the_packages_units_counting_imports_inside_functions():
    edges = unit_edges(REPO / PACKAGE, every_import)
    found = cycles(edges)
    assert not found, "import cycles between units of fairseq_idpg: " + " | ".join(describe(c, edges) for c in found)


def module_edges(root: Path) -> Dict[Tuple[str, str], List[str]]:
    """{(module A, module B): ["path:line", ...]} of every import between the package's modules (inside functions
    too), each name taken as the longest module it names (``from P.m import x``: ``P.m``; ``from P import m``:
    ``P.m`` where ``m`` is a module); the package's own ``__init__`` (the user dir) is left out, as above."""
    modules = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    edges: Dict[Tuple[str, str], List[str]] = {}
    for module, path in modules.items():
        if module == root.name:
            continue
        for node in every_import(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body):
            for name in imported_modules(node, module, path.name == "__init__.py"):
                parts = name.split(".")
                while parts and ".".join(parts) not in modules:
                    parts.pop()
                target = ".".join(parts)
                if target not in ("", module, root.name):
                    edges.setdefault((module, target), []).append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return edges


def test_no_import_cycle_between_the_packages_modules_counting_imports_inside_functions():
    edges = module_edges(REPO / PACKAGE)
    found = cycles(edges)
    assert not found, "import cycles between modules of fairseq_idpg: " + " | ".join(describe(c, edges) for c in found)


def test_the_check_finds_a_cycle_made_at_import_and_not_one_inside_functions(tmp_path):
    root = tmp_path / "pkg"
    for folder in ("a", "b"):
        (root / folder).mkdir(parents=True)
    (root / "__init__.py").write_text("from . import a, b\n")
    (root / "a" / "__init__.py").write_text("from pkg.b.x import f\n")
    (root / "b" / "__init__.py").write_text("")
    (root / "b" / "x.py").write_text("def f():\n    from pkg.a import g\n")
    (root / "c.py").write_text("from .b import x\n")
    edges = unit_edges(root)
    assert set(edges) == {("a", "b"), ("c", "b")}
    assert cycles(edges) == []
    assert cycles(unit_edges(root, every_import)) == [["a", "b"]]  # counting imports inside functions
    assert cycles(module_edges(root)) == [["pkg.a", "pkg.b.x"]]

    (root / "b" / "x.py").write_text("try:\n    from ..a import g\nexcept ImportError:\n    pass\n")
    edges = unit_edges(root)
    assert cycles(edges) == [["a", "b"]]
    assert "pkg/b/x.py:2 imports pkg.a" in describe(["a", "b"], edges)


ARCHITECTURE = REPO / "docs" / "architecture.md"
BACK_UP_AT_MOST = 4  # imports from a lower floor to a higher (or the same) one


def floors(page: Path) -> Dict[str, int]:
    """{unit: floor} from the page's "## Layers" table (``| 3 | `blocks`, `layout` |``)."""
    text = page.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n## ", 1)[0]
    found: Dict[str, int] = {}
    for floor, units in re.findall(r"^\| (\d+) \| (.+?) \|$", text, re.M):
        for unit in re.findall(r"`(\w+)`", units):
            assert unit not in found, f"{page}: {unit} is on two floors"
            found[unit] = int(floor)
    return found


def units_of(root: Path) -> Set[str]:
    """The package's top-level modules and subpackages."""
    return {p.stem for p in root.glob("*.py") if p.name != "__init__.py"} | {
        p.name for p in root.iterdir() if (p / "__init__.py").is_file()
    }


def back_up(edges, floor) -> List[str]:
    """The imports (inside functions too) from a unit to one on its own floor or above."""
    return [f"{a} (floor {floor[a]}) -> {b} (floor {floor[b]}): {edges[a, b][0]}" for a, b in sorted(edges)
            if floor[b] >= floor[a]]  # fmt: skip


def test_every_import_goes_down_the_floors_the_architecture_page_lists():
    floor = floors(ARCHITECTURE)
    assert set(floor) == units_of(REPO / PACKAGE), "units missing from, or gone but listed in, docs/architecture.md"
    up = back_up(unit_edges(REPO / PACKAGE, every_import), floor)
    assert len(up) <= BACK_UP_AT_MOST, "imports back up a floor:\n" + "\n".join(up)
    assert up == [], "imports back up a floor (the page's table: move the unit up):\n" + "\n".join(up)


def test_the_floor_check_counts_an_import_back_up(tmp_path):
    root = tmp_path / "pkg"
    (root / "low").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "low" / "__init__.py").write_text("def f():\n    from pkg import high\n")
    (root / "high.py").write_text("from pkg.low import f\n")
    (root / "leaf.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text("## Layers\n\n| floor | units |\n|---|---|\n| 0 | `leaf`, `low` |\n| 1 | `high` |\n\n## Next\n")
    floor = floors(page)
    assert floor == {"leaf": 0, "low": 0, "high": 1} and set(floor) == units_of(root)
    assert back_up(unit_edges(root, every_import), floor) == [
        "low (floor 0) -> high (floor 1): pkg/low/__init__.py:2 imports pkg.high"
    ]
