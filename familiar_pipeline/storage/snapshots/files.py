"""File steps every publish shares: temp names, fsyncs, and cleanup after a failed write."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Iterable

logger = logging.getLogger(__name__)


def temp_path(serving_dir: Path, stem: str) -> Path:
    return serving_dir / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def remove_quietly(paths: Iterable[Path]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("could not remove %s after a failed publish: %s", path, exc)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    if os.name != "posix":  # pragma: no cover - directories cannot be fsynced on Windows
        return
    fsync_file(path)
