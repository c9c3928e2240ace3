"""The import structure the layout promises, checked by walking every module's `ast`.

Three floors, top down, with no exception:

1. the application, `familiar_bot.app`: the `familiar` command (`app.cli`), the evaluators
   (`app.eval`) and the `familiar up` process supervisor (`app.supervisor`). It drives both sides
   and may import either; nothing else imports it (`familiar_bot`'s other modules or the pipeline);
2. the bot runtime, the rest of `familiar_bot` (responder, transports, prompt assembly): from
   `familiar_pipeline` it imports only its `storage`, `config` and `models` packages and the
   projectors' table declarations and reads (`projectors.<name>.tables`/`.reads`, `projectors.vectors`):
   what the bot reads, not how it is produced;
3. the pipeline, `familiar_pipeline`, which never imports `familiar_bot` (it runs without the bot).

Inside the pipeline:

* its packages are layered, each importing only those below it: `config` (the ground floor: which
  familiar, where its settings live, what they may say; it imports nothing else of the pipeline, and
  the projectors register their names and knobs with it), `storage` (the kernel: records, tables,
  the store, snapshots), `models`, `erasure`, `engine`, `projectors`, then `testing` and `defs`,
  then the code location and what runs it; so the engine imports no projector (they plug in through
  its spec and registry, the built-ins through an entry point), erasure imports no engine (the run
  loop hands it the specs), and there is no loop between packages;
* a projector's spec module names its run logic ("package.module:attribute", imported on first use)
  instead of importing it: it imports only the engine's spec, config, storage, `projectors.vectors`
  and projectors' table declarations and store helpers, so registering the specs (loading any config
  does) imports no run logic, prompt or model client (tests/test_projector_specs.py checks the modules
  a fresh process has after `load_config()`);
* production code never imports `familiar_pipeline.testing` (the scripted models are plugged in from
  outside: test fixtures, an entry point, `familiar up --demo`), except the demo flag, in the
  application's `up` and `chat` commands (`DEMO_FLAG` below);
* an import inside a function that reaches a project module is either under `if TYPE_CHECKING:` or
  says why it is lazy (a `# lazy:` comment: an import the caller may never need, or a preload), so
  none hides a loop; the CLI's commands import what they run lazily by design (`familiar --help`);
* no import cycles between modules.

Every import counts, at module level or inside a function (a lazy import still makes a cycle, it
only hides it until call time); imports under `if TYPE_CHECKING:` do not, since they never run.
An import of `a.b.c` is an edge to the module `a.b.c` (the package `__init__` files Python runs
first hold no imports that could close a cycle).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("familiar_pipeline", "familiar_bot")
# The application: above the bot runtime and the pipeline, imported by neither.
APP = "familiar_bot.app"
BOT_MAY_IMPORT = ("familiar_pipeline.storage", "familiar_pipeline.config", "familiar_pipeline.models")
# What the bot reads of a projector: its table declarations and their reads (not its run logic).
BOT_MAY_READ = re.compile(r"^familiar_pipeline\.projectors(\.vectors|\.[a-z_]+\.(tables|reads))$")


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
    assert "familiar_pipeline.projectors.dossiers.prompt" in GRAPH["familiar_pipeline.projectors.dossiers.run"]
    assert "familiar_pipeline.models.bert_onnx" in GRAPH["familiar_pipeline.models.minilm"]
    assert "familiar_pipeline.config" not in GRAPH["familiar_pipeline.models.embedders"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def in_app(module: str) -> bool:
    return module == APP or module.startswith(APP + ".")


def test_the_pipeline_never_imports_the_bot():
    offenders = {m: sorted(t for t in targets if t.startswith("familiar_bot"))
                 for m, targets in GRAPH.items() if m.startswith("familiar_pipeline")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_nothing_below_the_application_imports_it():
    # The bot runtime and the pipeline never reach up into the CLI, the evaluators or the supervisor.
    offenders = {m: sorted(t for t in targets if in_app(t)) for m, targets in GRAPH.items() if not in_app(m)}
    assert {m: t for m, t in offenders.items() if t} == {}
    assert {"familiar_bot.app.cli.main", "familiar_bot.app.eval.evaluation", "familiar_bot.app.supervisor"} <= set(GRAPH)


def test_the_bot_reads_only_storage_config_and_models():
    # Every module of the bot runtime: familiar_bot but its application package, which may import anything.
    offenders = {}
    for module, targets in GRAPH.items():
        if not module.startswith("familiar_bot") or in_app(module):
            continue
        bad = sorted(t for t in targets if t.startswith("familiar_pipeline")
                     and not t.startswith(tuple(p + "." for p in BOT_MAY_IMPORT)) and t not in BOT_MAY_IMPORT
                     and not BOT_MAY_READ.match(t) and t not in ("familiar_pipeline", "familiar_pipeline.projectors"))
        if bad:
            offenders[module] = bad
    assert offenders == {}


def test_no_import_cycles_between_modules():
    assert cycles(GRAPH) == []


# The pipeline's layers, bottom first; a package may import only its own layer's or lower ones.
LAYERS = (
    ("familiar_pipeline.config", "familiar_pipeline.shards"),
    ("familiar_pipeline.storage",),
    ("familiar_pipeline.models",),
    ("familiar_pipeline.erasure",),
    ("familiar_pipeline.engine",),
    ("familiar_pipeline.projectors",),
    ("familiar_pipeline.testing", "familiar_pipeline.defs", "familiar_pipeline.event_log",
     "familiar_pipeline.dagster_internals"),
    ("familiar_pipeline.definitions",),
    ("familiar_pipeline.run_worker", "familiar_pipeline.run_launcher", "familiar_pipeline.backfill",
     "familiar_pipeline.webserver", "familiar_pipeline.forget", "familiar_pipeline.instance"),
)


def _layer(module: str) -> int | None:
    for rank, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return rank
    return None


def test_the_pipeline_packages_import_only_downwards():
    upward = {}
    for module, targets in GRAPH.items():
        rank = _layer(module)
        if rank is None:
            continue
        up = sorted(t for t in targets if (r := _layer(t)) is not None and r > rank)
        if up:
            upward[module] = up
    assert upward == {}
    assert all(_layer(m) is not None for m in MODULES if m.startswith("familiar_pipeline.")), \
        [m for m in MODULES if m.startswith("familiar_pipeline.") and _layer(m) is None]


# Dagster's private modules (`dagster._...`) are imported by one documented adapter only, and only the
# instance's own pieces (its event log, run launcher and run worker) and the asset checks (a check result
# per partition, with the materialization it checked: Dagster's public API has no form for it) import the
# adapter: the rest of `defs/` uses Dagster's public API.
DAGSTER_ADAPTER = "familiar_pipeline.dagster_internals"
INSTANCE_PIECES = ("familiar_pipeline.event_log", "familiar_pipeline.run_launcher", "familiar_pipeline.run_worker",
                   "familiar_pipeline.defs.checks")


def private_dagster_imports(module: str) -> list[str]:
    """Every `dagster._...` module `module` imports, anywhere in its body (TYPE_CHECKING blocks included)."""
    path, _ = MODULES[module]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
    return sorted(name for name in found if name.startswith("dagster._"))


def test_only_the_adapter_imports_private_dagster_modules():
    private = {m: private_dagster_imports(m) for m in MODULES}
    assert {m: found for m, found in private.items() if found and m != DAGSTER_ADAPTER} == {}
    assert private[DAGSTER_ADAPTER], "the adapter is where they are"
    users = sorted(m for m, targets in GRAPH.items() if DAGSTER_ADAPTER in targets)
    assert users == sorted(INSTANCE_PIECES)


def test_the_engine_imports_no_projector_and_nothing_above_it():
    # The projectors plug in (ProjectorSpec, register_projector); the registry finds the built-ins
    # through the `familiar.projectors` entry point, never by importing them.
    engine = {m: sorted(t for t in targets if _layer(t) is not None and _layer(t) > _layer("familiar_pipeline.engine"))
              for m, targets in GRAPH.items() if m.startswith("familiar_pipeline.engine")}
    assert {m: t for m, t in engine.items() if t} == {}
    assert "familiar_pipeline.engine.run_loop" in GRAPH, "the per-familiar run loop is the engine's"


def test_no_package_loop_between_the_pipeline_packages():
    # Module cycles are forbidden above; this is the same rule one level up (type-only imports aside).
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        packages.setdefault(package(module), set()).update(package(t) for t in targets if package(t) != package(module))
    assert cycles(packages) == []


def test_config_is_the_ground_floor():
    # Config imports nothing else of the pipeline: no storage (where a familiar's settings live is
    # `config.places`, which `storage.paths` builds on), no model, no projector (they register with it).
    config = {m: sorted(t for t in targets if t.startswith("familiar_pipeline") and not t.startswith("familiar_pipeline.config"))
              for m, targets in GRAPH.items() if m.startswith("familiar_pipeline.config")}
    assert {m: t for m, t in config.items() if t} == {}


# What a projector's spec module may import of the project: the engine's spec, config, storage, the vector
# projectors' shared spec and records, and projectors' table declarations with their store helpers. Its run
# logic, prompt, scripted answers and anything reaching the model client are named, not imported.
SPEC_MAY_IMPORT = re.compile(r"^familiar_pipeline\.(engine\.spec|config(\..+)?|storage(\..+)?"
                             r"|projectors\.vectors|projectors\.[a-z_]+\.(tables|store))$")


def test_a_spec_names_its_run_logic_and_imports_none():
    specs = [m for m in MODULES if re.fullmatch(r"familiar_pipeline\.projectors\.[a-z_]+\.spec", m)]
    assert len(specs) >= 11, specs
    offenders = {m: sorted(t for t in GRAPH[m] if t != m.removesuffix(".spec") and not SPEC_MAY_IMPORT.match(t))
                 for m in specs}
    assert {m: t for m, t in offenders.items() if t} == {}
    assert "familiar_pipeline.projectors.summary.run" not in GRAPH["familiar_pipeline.projectors.summary.spec"]


# The demo flag plugs the scripted models in: `familiar up --demo` names the demo's scripted model for its
# processes (testing.scripted.DEMO_RESPONDER, under testing.fake_llm.FAKE_LLM_ENV), and `familiar chat`
# refuses a scripted model unless that variable is set. These two application modules may import them.
DEMO_FLAG = ("familiar_bot.app.cli.commands.up", "familiar_bot.app.cli.commands.chat")


def test_production_code_never_imports_the_scripted_models():
    offenders = {m: sorted(t for t in targets if t.startswith("familiar_pipeline.testing"))
                 for m, targets in GRAPH.items()
                 if not m.startswith("familiar_pipeline.testing") and m not in DEMO_FLAG}
    assert {m: t for m, t in offenders.items() if t} == {}


def lazy_imports(module: str) -> list[tuple[int, str, bool]]:
    """(line, target, says why) of every import of a project module inside a function of ``module``."""
    path, _ = MODULES[module]
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [child.module or ""] if isinstance(child, ast.ImportFrom) else [a.name for a in child.names]
                if child_is_project(child, names):
                    said = "# lazy:" in lines[child.lineno - 1] or "# lazy:" in lines[child.lineno - 2]
                    found.append((child.lineno, names[0], said))
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def child_is_project(node: ast.AST, names: list[str]) -> bool:
    return (isinstance(node, ast.ImportFrom) and bool(node.level)) or any(n.startswith(PACKAGES) for n in names)


def test_every_lazy_project_import_says_why():
    unexplained = {m: [(line, target) for line, target, said in lazy_imports(m) if not said]
                   for m in MODULES if not m.startswith("familiar_bot.app.cli")}
    assert {m: v for m, v in unexplained.items() if v} == {}
