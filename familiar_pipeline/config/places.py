"""Which familiar, and where its settings live: the ground floor under config and storage.

A familiar is named by its id (one folder name, one Dagster partition, the ``ego:<id>`` key)
and lives in one folder under the data root (``data/familiars/<id>/``). The data root comes
from ``FAMILIAR_DATA_ROOT`` so tests and benchmarks can point at a temporary folder; the
shipped defaults (``_default/``) are always found next to the package even when the data
root is elsewhere. Config loading needs exactly this to find a familiar's character.toml;
storage (`storage.paths`) builds the paths of the familiar's own files on it. Only the
standard library: config imports nothing else of the pipeline.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DEFAULT_DIR = REPO_ROOT / "data" / "familiars" / "_default"
DEFAULT_FAMILIAR_DIRNAME = "_default"
CHARACTER_TOML = "character.toml"  # a familiar's settings file, in its folder (and in `_default/`)

FAMILIAR_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class InvalidFamiliarId(ValueError):
    pass


def checked_name(value: object, pattern: re.Pattern[str], what: str, rule: str,
                 error: type[Exception] = ValueError) -> str:
    """`value` if it is a string that `pattern` matches whole; else `error` naming it and the rule."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise error(f"invalid {what} {value!r}: {rule}")
    return value


def validate_familiar_id(familiar_id: str) -> str:
    """Familiar ids name folders, Dagster partitions and ``ego:<id>`` keys."""
    return checked_name(familiar_id, FAMILIAR_ID, "familiar id",
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
    if (candidate / CHARACTER_TOML).is_file():
        return candidate
    return SHIPPED_DEFAULT_DIR


def familiar_dir(familiar_id: str, root: Path | None = None) -> Path:
    """The folder of one familiar (its id checked first); nothing is created."""
    return (root or data_root()) / validate_familiar_id(familiar_id)
