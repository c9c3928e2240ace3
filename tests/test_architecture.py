"""The import structure the layout promises, checked by walking every module's `ast`.

Rules:

* nothing in `familiar_pipeline` imports `familiar_bot` (the pipeline runs without the bot);
* the bot's runtime modules (everything but `familiar_bot.cli` and `familiar_bot.eval`, which drive
  the pipeline on purpose) import from `familiar_pipeline` only its `storage`, `config` and `models`
  packages: what the bot reads, not how it is produced;
* no import cycles between modules.

Every import counts, at module level or inside a function (a lazy import still makes a cycle, it
only hides it until call time); imports under `if TYPE_CHECKING:` do not, since they never run.
An import of `a.b.c` is an edge to the module `a.b.c` (the package `__init__` files Python runs
first hold no imports that could close a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("familiar_pipeline", "familiar_bot")
BOT_MAY_IMPORT = ("familiar_pipeline.storage", "familiar_pipeline.config", "familiar_pipeline.models")
BOT_DRIVERS = ("familiar_bot.cli", "familiar_bot.eval")


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _known(name: str) -> str | None:
    """The longest project module `name` lies in, or None for a third-party import."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str) -> set[str]:
    """Project modules `module` imports, anywhere in its body except `if TYPE_CHECKING:` blocks."""
    path, is_package = MODULES[module]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    package = ".".join(base + ([child.module] if child.module else []))
                else:
                    package = child.module or ""
                targets = [f"{package}.{alias.name}" if f"{package}.{alias.name}" in MODULES else package
                           for alias in child.names]
            else:
                visit(child)
                continue
            for target in targets:
                known = _known(target)
                if known and known != module:
                    found.add(known)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_the_walk_sees_every_kind_of_import():
    # Guards the checker itself: a relative import, an in-function import and a TYPE_CHECKING import.
    assert "familiar_pipeline.projectors.horizon" in GRAPH["familiar_pipeline.projectors.dossiers"]
    assert "familiar_pipeline.testing.fake_llm" in GRAPH["familiar_pipeline.models.llm"]
    assert "familiar_pipeline.config" not in GRAPH["familiar_pipeline.models.embedders"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_pipeline_never_imports_the_bot():
    offenders = {m: sorted(t for t in targets if t.startswith("familiar_bot"))
                 for m, targets in GRAPH.items() if m.startswith("familiar_pipeline")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_the_bot_reads_only_storage_config_and_models():
    offenders = {}
    for module, targets in GRAPH.items():
        if not module.startswith("familiar_bot") or module.startswith(BOT_DRIVERS):
            continue
        bad = sorted(t for t in targets if t.startswith("familiar_pipeline")
                     and not t.startswith(tuple(p + "." for p in BOT_MAY_IMPORT)) and t not in BOT_MAY_IMPORT)
        if bad:
            offenders[module] = bad
    assert offenders == {}


def test_no_import_cycles_between_modules():
    assert cycles(GRAPH) == []
