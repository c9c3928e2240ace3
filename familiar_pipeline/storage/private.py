"""Private files: what a familiar remembers is readable by its owner only.

A turn log holds direct messages; `memory.duckdb`, the snapshots, the indexes and
the LLM cache hold what was said in them. Another local account must read none of
it. Three layers, each enough on its own for what it covers:

* the data root and every familiar folder are 0700 (`private_dir`), so no other
  account can even reach a file inside, whatever the file's own mode;
* every process the project starts works under umask 077 (`use_private_umask`: the
  `familiar` command and the Dagster code location set it), so what it creates is
  0600 (files) or 0700 (folders), including what DuckDB, tantivy, SQLite (WAL and
  SHM files) and Dagster create on their own;
* a folder made by an earlier version with looser modes is tightened the next time
  the bot or `familiar up` opens it (`tighten_tree`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600


def use_private_umask() -> int:
    """Make what this process (and its children) create private; returns the previous umask."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: str | os.PathLike) -> Path:
    """`path` as a folder only its owner can enter: created 0700 (parents too), or tightened to it."""
    folder = Path(path)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    for created in missing:  # parents we made: private too (mkdir's mode is filtered by the umask)
        _chmod_own(created, DIR_MODE)
    _chmod_own(folder, DIR_MODE)
    return folder


def private_file(path: str | os.PathLike) -> Path:
    """Create `path` empty with mode 0600 unless it exists; tighten an existing one of ours to 0600."""
    target = Path(path)
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass
    _chmod_own(target, FILE_MODE)
    return target


def tighten_tree(root: str | os.PathLike) -> int:
    """Folders 0700 and files 0600 under `root` (its own folder included); returns how many changed.

    Only what this account owns is changed; symbolic links are not followed.
    """
    changed = 0
    top = Path(root)
    if not top.is_dir():
        return 0
    for folder, _dirs, files in os.walk(top):
        changed += _chmod_own(Path(folder), DIR_MODE)
        for name in files:
            changed += _chmod_own(Path(folder) / name, FILE_MODE)
    return changed


def is_private(path: str | os.PathLike) -> bool:
    """No permission bit for group or others."""
    return stat.S_IMODE(os.lstat(path).st_mode) & 0o077 == 0


def _chmod_own(path: Path, mode: int) -> int:
    """chmod `path` to `mode` if it is ours, not a link, and looser; 1 if changed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return 0
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077 == 0:
        return 0
    os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077 | (mode & 0o700))
    return 1
