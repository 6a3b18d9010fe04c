"""docs/architecture.md stays true: every module of every package is in its layer diagram,
code outside a package imports only from its face, and no import circle joins more than
three modules of the product.

The diagram is the data: the fenced block under "## Layers" names each package and its
modules, and this test reads it. Run as a script to list the import circles of the product:

    python tests/test_architecture.py
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PRODUCT = ("p2pcrawl", "protocol", "storage")
MAX_CIRCLE = 3

# Faces bypassed and circles larger than MAX_CIRCLE that are known and tolerated for now.
# Each entry must still be true: once it is not, delete it.
KNOWN_BYPASSES: set[tuple[str, str]] = set()
KNOWN_CIRCLES: list[set[str]] = []


@dataclass(frozen=True, slots=True)
class Import:
    importer: str  # dotted module name
    target: str  # the module (or package) it names
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_files() -> Iterator[Path]:
    for top in PRODUCT:
        yield from sorted((ROOT / top).rglob("*.py"))


def packages() -> set[str]:
    return {module_name(p) for p in product_files() if p.name == "__init__.py"}


def modules() -> set[str]:
    return {module_name(p) for p in product_files()}


def faces() -> dict[str, set[str]]:
    """Package -> the names its ``__init__`` exports (``__all__``)."""
    out: dict[str, set[str]] = {}
    for path in product_files():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                out[module_name(path)] = set(ast.literal_eval(node.value))
    return out


def imports() -> list[Import]:
    """Every import of the product, those under ``if TYPE_CHECKING:`` too (a dependency all
    the same). ``from package import name`` names the submodule ``name`` if there is one,
    unless the importer is outside the package and the face exports ``name``: that is an
    import from the face."""
    known = modules()
    exported = faces()
    out: list[Import] = []
    for path in product_files():
        me = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [Import(me, a.name, node.lineno) for a in node.names if _ours(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.module and _ours(node.module):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    inside = me.startswith(node.module + ".")
                    face = a.name in exported.get(node.module, ()) and not inside
                    target = sub if sub in known and not face else node.module
                    out.append(Import(me, target, node.lineno))
    return out


def _ours(name: str) -> bool:
    return name.split(".")[0] in PRODUCT


def package_of(module: str, pkgs: set[str]) -> str:
    """The innermost package a module belongs to (a package's face belongs to itself)."""
    if module in pkgs:
        return module
    return module.rpartition(".")[0]


def bypasses() -> set[tuple[str, str]]:
    """(importer, target) where code outside a package imports one of its modules."""
    pkgs = packages()
    out = set()
    for imp in imports():
        if imp.target in pkgs:
            continue  # the face itself
        owner = package_of(imp.target, pkgs)
        if imp.importer != owner and not imp.importer.startswith(owner + "."):
            out.add((imp.importer, imp.target))
    return out


def circles() -> list[set[str]]:
    """The strongly connected components of the import graph with more than one module
    (Tarjan's algorithm), largest first."""
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for imp in imports():
        if imp.target in graph and imp.target != imp.importer:
            graph[imp.importer].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=len, reverse=True)


_ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[a-z_][a-z0-9_]*/)(?P<rest>.*)$")
_ARROW = re.compile(r"^\s*(\|.*|v)$")
_WORDS = re.compile(r"[a-z_][a-z0-9_]*")


def diagram() -> dict[str, set[str]]:
    """Package (dotted) -> the modules the layer diagram lists for it. A line that starts
    with ``name/`` opens a package (indented: a subpackage of the last unindented one); the
    words after it, and on the indented lines below up to the next package, are its modules;
    text in parentheses is commentary, and a line of an arrow (``|``, ``v``) ends a list."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    listed: dict[str, set[str]] = {}
    top = current = ""
    for raw in block.splitlines()[1:]:
        line = re.sub(r"\([^)]*\)", "", raw).rstrip()
        entry = _ENTRY.match(line)
        if entry is not None:
            name = entry["name"].rstrip("/")
            if entry["indent"]:
                current = f"{top}.{name}"
            else:
                top = current = name
            listed.setdefault(current, set())
            line = entry["rest"]
        elif not line.startswith(" ") or not current or _ARROW.match(line):
            current = ""  # a line between the packages (an arrow, a caption)
            continue
        listed[current].update(_WORDS.findall(line))
    return listed


# --- the tests -------------------------------------------------------------------------------


def test_every_module_of_every_package_is_in_the_diagram() -> None:
    listed = diagram()
    pkgs = packages()
    assert set(listed) == pkgs, "packages the diagram lists are not the product's packages"
    for pkg in pkgs:
        here = {
            m.rpartition(".")[2] for m in modules() if m not in pkgs and package_of(m, pkgs) == pkg
        }
        here = {m for m in here if not m.startswith("__")}
        assert listed[pkg] - here == set(), f"{pkg}: the diagram lists modules that are gone"
        assert here - listed[pkg] == set(), f"{pkg}: modules missing from the diagram"


def test_code_outside_a_package_imports_only_from_its_face() -> None:
    found = bypasses()
    assert found - KNOWN_BYPASSES == set(), "faces bypassed"
    assert KNOWN_BYPASSES - found == set(), "fixed: remove them from KNOWN_BYPASSES"


def test_no_import_circle_joins_more_than_three_modules() -> None:
    big = [c for c in circles() if len(c) > MAX_CIRCLE]
    assert [c for c in big if c not in KNOWN_CIRCLES] == [], "import circles"
    assert [c for c in KNOWN_CIRCLES if c not in big] == [], "fixed: remove from KNOWN_CIRCLES"


MAX_MODULE_LINES = 450  # a module a newcomer reads in one sitting (docs/architecture.md)


def test_no_product_module_is_longer_than_a_sitting() -> None:
    lines = {module_name(p): len(p.read_text().splitlines()) for p in product_files()}
    assert len(lines) > 100  # the product's modules were found
    assert {m: n for m, n in lines.items() if n > MAX_MODULE_LINES} == {}


def test_the_checks_read_the_diagram_and_the_imports() -> None:
    """The parser finds what is there, so the tests above cannot pass by reading nothing."""
    listed = diagram()
    assert {"node", "rpc", "endpoint"} <= listed["protocol"]
    assert {"engine", "frontier"} <= listed["p2pcrawl.crawl"]
    assert any(i.target == "protocol" for i in imports())  # the face is imported somewhere


if __name__ == "__main__":
    for component in circles():
        print(f"{len(component)}: {' '.join(sorted(component))}")
    for importer, target in sorted(bypasses()):
        print(f"bypass: {importer} imports {target}")
