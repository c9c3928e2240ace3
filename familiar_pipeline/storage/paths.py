"""Where a familiar's files live.

One folder per familiar under the data root (``data/familiars/<id>/``). The data
root comes from ``FAMILIAR_DATA_ROOT`` so tests and benchmarks can point at a
temporary folder; the shipped defaults (``_default/``) are always found next to
the package even when the data root is elsewhere.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DEFAULT_DIR = REPO_ROOT / "data" / "familiars" / "_default"
DEFAULT_FAMILIAR_DIRNAME = "_default"
CONSOLE_SPEAKER_FILE = "console_speaker"  # the name the console asked for once, in a familiar's folder

_FAMILIAR_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class InvalidFamiliarId(ValueError):
    pass


def checked_name(value: object, pattern: re.Pattern[str], what: str, rule: str,
                 error: type[Exception] = ValueError) -> str:
    """`value` if it is a string that `pattern` matches whole; else `error` naming it and the rule."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise error(f"invalid {what} {value!r}: {rule}")
    return value


def did_you_mean(name: str, options: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> str:
    """`"; did you mean 'facts'?"` for the options close to a mistyped name, else "".

    Every command that refuses an unknown name (a familiar, a projection) says it in the
    same words, so a typo is one glance from its fix.
    """
    near = difflib.get_close_matches(name, list(options), n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(repr(m) for m in near)}?" if near else ""


def validate_familiar_id(familiar_id: str) -> str:
    """Familiar ids name folders, Dagster partitions and ``ego:<id>`` keys."""
    return checked_name(familiar_id, _FAMILIAR_ID, "familiar id",
                        "use 1-63 characters of a-z, 0-9, '_' or '-', starting with a letter or digit",
                        InvalidFamiliarId)


def data_root() -> Path:
    """The folder holding one sub-folder per familiar (absolute)."""
    configured = os.environ.get("FAMILIAR_DATA_ROOT")
    root = Path(configured) if configured else REPO_ROOT / "data" / "familiars"
    return root.expanduser().resolve()


def default_dir(root: Path | None = None) -> Path:
    """The `_default` folder: the data root's own if present, else the shipped one."""
    candidate = (root or data_root()) / DEFAULT_FAMILIAR_DIRNAME
    if (candidate / "character.toml").is_file():
        return candidate
    return SHIPPED_DEFAULT_DIR


@dataclass(frozen=True)
class FamiliarPaths:
    """Every path of one familiar. Pure: nothing is created on construction."""

    familiar_id: str
    root: Path

    @classmethod
    def for_id(cls, familiar_id: str, root: Path | None = None) -> "FamiliarPaths":
        validate_familiar_id(familiar_id)
        return cls(familiar_id=familiar_id, root=(root or data_root()))

    @property
    def dir(self) -> Path:
        return self.root / self.familiar_id

    @property
    def turns_db(self) -> Path:
        return self.dir / "turns.db"

    @property
    def memory_db(self) -> Path:
        return self.dir / "memory.duckdb"

    @property
    def writer_lock(self) -> Path:
        """Held (flock, exclusive) by the one process writing this familiar's projections."""
        return self.dir / "memory.lock"

    @property
    def serving_dir(self) -> Path:
        return self.dir / "serving"

    @property
    def fts_dir(self) -> Path:
        return self.dir / "fts"

    @property
    def fts_turns(self) -> Path:
        return self.fts_dir / "turns"

    @property
    def fts_facts(self) -> Path:
        return self.fts_dir / "facts"

    @property
    def character_toml(self) -> Path:
        return self.dir / "character.toml"

    @property
    def character_md(self) -> Path:
        return self.dir / "character.md"

    @property
    def lorebook_toml(self) -> Path:
        return self.dir / "lorebook.toml"

    @property
    def console_speaker(self) -> Path:
        """The name the console asked for once (`familiar chat`); erased with that person."""
        return self.dir / CONSOLE_SPEAKER_FILE

    @property
    def cache_dir(self) -> Path:
        """LLM response cache and other rebuildable scratch."""
        return self.dir / "cache"

    @property
    def llm_cache(self) -> Path:
        """The LLM response cache (replies keyed by request; `models.llm.ResponseCache`)."""
        return self.cache_dir / "llm_cache.sqlite"


def list_familiars(root: Path | None = None) -> list[str]:
    """Familiar ids that have a folder with a turn log, sorted."""
    base = root or data_root()
    if not base.is_dir():
        return []
    return sorted(
        p.name
        for p in base.iterdir()
        if p.is_dir() and _FAMILIAR_ID.match(p.name) and (p / "turns.db").exists()
    )
