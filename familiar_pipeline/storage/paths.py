"""Where a familiar's files live.

One folder per familiar under the data root (``data/familiars/<id>/``). Which familiar and
where that folder is (the id rule, the data root from ``FAMILIAR_DATA_ROOT``, the shipped
``_default/``) is config's ground floor, `familiar_pipeline.config.places`, re-exported here;
this module adds the paths of the familiar's own files.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from familiar_pipeline.config.places import (CHARACTER_TOML, DEFAULT_FAMILIAR_DIRNAME, FAMILIAR_ID, REPO_ROOT,
                                             SHIPPED_DEFAULT_DIR, InvalidFamiliarId, checked_name, data_root, default_dir,
                                             validate_familiar_id)

__all__ = ["CHARACTER_TOML", "CONSOLE_SPEAKER_FILE", "DEFAULT_FAMILIAR_DIRNAME", "REPO_ROOT", "SHIPPED_DEFAULT_DIR",
           "FamiliarPaths", "InvalidFamiliarId", "checked_name", "data_root", "default_dir", "did_you_mean",
           "list_familiars", "validate_familiar_id"]

CONSOLE_SPEAKER_FILE = "console_speaker"  # the name the console asked for once, in a familiar's folder


def did_you_mean(name: str, options: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> str:
    """`"; did you mean 'facts'?"` for the options close to a mistyped name, else "".

    Every command that refuses an unknown name (a familiar, a projection) says it in the
    same words, so a typo is one glance from its fix.
    """
    near = difflib.get_close_matches(name, list(options), n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(repr(m) for m in near)}?" if near else ""


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
        return self.dir / CHARACTER_TOML

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
        if p.is_dir() and FAMILIAR_ID.match(p.name) and (p / "turns.db").exists()
    )
