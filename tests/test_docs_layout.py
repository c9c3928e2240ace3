"""The layout docs/layout.md and docs/architecture.md describe is the tree as it is.

Every path named in a layout table exists (a folder row's `name.py` / `name/` cells are
looked up inside that folder), every module and package of the pipeline appears in
both tables, and at every depth a table shows (a folder two or more of whose modules it
names) every module and subpackage of that folder is named, so a file added, moved or
removed without its documentation fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH = re.compile(r"`([A-Za-z0-9_./]+)`")


ROOTS = ("familiar_pipeline/", "familiar_bot/", "data/", "dagster_home/", "benchmarks/", "docs/", "notebooks/")


def layout_rows(doc: str, heading: str) -> list[str]:
    """The rows of the code layout table (not the per-familiar files table that may follow it)."""
    text = (REPO / doc).read_text(encoding="utf-8")
    section = text[text.index(heading):]
    section = section[: section.index("\n## ", 1) if "\n## " in section[1:] else len(section)]
    return [line for line in section.splitlines() if line.startswith(tuple(f"| `{r}" for r in ROOTS))]


def _find(folder: Path, name: str) -> Path:
    """``name`` in ``folder``, else in one of its subfolders (a row's "each with its `spec.py`"), else beside it."""
    for candidate in (folder / name, *(sub / name for sub in sorted(folder.iterdir()) if sub.is_dir()),
                      folder.parent / name):
        if candidate.exists():
            return candidate
    return folder / name


def _rooted(name: str) -> Path:
    """A path with folders: from the repository root, else from a package's (`engine/schedule.py`)."""
    for base in (REPO, REPO / "familiar_pipeline", REPO / "familiar_bot"):
        if (base / name).exists():
            return base / name
    return REPO / name


def named_paths(row: str) -> list[Path]:
    """The files and folders one table row names, resolved against the row's own folder."""
    first, rest = row.split("|")[1:3]
    names = PATH.findall(first)
    heads = [REPO / names[0]] + [REPO / n if "/" in n.rstrip("/") else (REPO / names[0]).parent / n for n in names[1:]]
    folder = next((h for h in heads if h.suffix == "" and h.is_dir()), heads[0].parent)
    found = list(heads)
    for name in PATH.findall(rest):
        if name.endswith(".py") or name.endswith("/"):
            found.append(_rooted(name) if "/" in name.rstrip("/") else _find(folder, name))
    return found


def test_every_path_in_the_layout_tables_exists():
    missing = []
    for doc, heading in (("docs/layout.md", "## Layout"), ("docs/architecture.md", "## 2. Code layout")):
        for row in layout_rows(doc, heading):
            missing += [f"{doc}: {p.relative_to(REPO)}" for p in named_paths(row) if not p.exists()]
    assert missing == []


def test_every_pipeline_module_and_package_is_in_both_tables():
    for doc, heading in (("docs/layout.md", "## Layout"), ("docs/architecture.md", "## 2. Code layout")):
        named = {p.resolve() for row in layout_rows(doc, heading) for p in named_paths(row)}
        top = [p for p in (REPO / "familiar_pipeline").iterdir()
               if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())]
        unnamed = sorted(str(p.relative_to(REPO)) for p in top
                         if p.resolve() not in named and not (p.name == "definitions.py" and doc != "docs/layout.md"))
        assert unnamed == [], doc


def _shown_folders(doc: str, heading: str) -> tuple[set[Path], set[Path]]:
    """The paths a table names, and the package folders it lists files of (two or more of their own
    modules named, not through a row's "each with its ..." look-up in a subfolder)."""
    named: set[Path] = set()
    listed: set[Path] = set()
    for row in layout_rows(doc, heading):
        paths = named_paths(row)
        named |= {p.resolve() for p in paths}
        first = PATH.findall(row.split("|")[1])
        folders = [REPO / n for n in first if (REPO / n).is_dir()] or [(REPO / first[0]).parent]
        # Named in the row's own folder (or by a path from the root), not found in a subfolder.
        listed |= {p.resolve() for p in paths if p.parent in folders or p.parent.parent in folders and p.name in
                   {q.rstrip("/").split("/")[-1] for q in PATH.findall(row) if "/" in q.rstrip("/")}}
    counts: dict[Path, int] = {}
    for path in listed:
        if path.suffix == ".py" and path.name != "__init__.py":
            counts[path.parent] = counts.get(path.parent, 0) + 1
    return named, {folder for folder, n in counts.items() if n >= 2 and (folder / "__init__.py").exists()}


def test_every_module_of_a_folder_the_tables_list_is_named():
    """At every depth a table shows: a folder whose files it lists has each of its modules and
    subpackages named, so a module added beside them without a word fails here."""
    for doc, heading in (("docs/layout.md", "## Layout"), ("docs/architecture.md", "## 2. Code layout")):
        named, folders = _shown_folders(doc, heading)
        unnamed = sorted(
            str(p.relative_to(REPO)) for folder in folders for p in folder.iterdir()
            if ((p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists()))
            and p.resolve() not in named and p.name != "definitions.py")
        assert unnamed == [], doc
