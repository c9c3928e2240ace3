"""The lorebook: authored canon that enters the prompt when the conversation names it.

``lorebook.toml`` (beside ``character.toml``; never written by code)::

    [[entries]]
    keys = ["Pixel", "the cat"]   # any key appearing activates the entry
    content = "Pixel is Cass's grey cat; she knocks plants over."
    priority = 10                 # higher first; file order breaks ties (default 0)
    selective = false             # true: every key must appear (default false)

Keys match case-insensitively on word boundaries ("cat" does not fire on
"concatenate", as a substring test would) against the channel's recent
window and the new message. The file is re-parsed only when its bytes change.
A file that is not valid TOML, or whose ``entries`` is not a list of tables, is
logged once and the previous good entries stay in use (none if it was never
good), so a typo mid-edit never costs a reply or silently drops canon. A single
bad entry (no usable keys, empty content, a non-integer priority) is skipped
with one warning and the rest load.
"""

from __future__ import annotations

import logging
import re
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from familiar_bot.prompt.layers.common import content_hash

log = logging.getLogger(__name__)

_ENTRY_KEYS = {"keys", "content", "priority", "selective"}


class LorebookError(ValueError):
    """The file cannot be used as a whole (the message says where and why)."""


@dataclass(frozen=True)
class LoreEntry:
    index: int  # position in the file: the tie-breaker and the cache key's identity
    keys: tuple[str, ...]
    content: str
    priority: int = 0
    selective: bool = False
    patterns: tuple[re.Pattern, ...] = ()

    def matches(self, haystack: str) -> bool:
        """``haystack`` must already be casefolded."""
        hits = (p.search(haystack) is not None for p in self.patterns)
        return all(hits) if self.selective else any(hits)


def key_pattern(key: str) -> re.Pattern:
    """Whole-word, case-insensitive: no word character directly before or after."""
    return re.compile(r"(?<!\w)" + re.escape(key.casefold()) + r"(?!\w)")


def parse_lorebook(text: str, source: str = "lorebook.toml") -> tuple[list[LoreEntry], list[str]]:
    """Entries and per-entry problems; raises :class:`LorebookError` for a file unusable as a whole."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LorebookError(f"{source} is not valid TOML: {exc}") from None
    raw = data.get("entries", [])
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise LorebookError(f"{source}: 'entries' must be an array of tables ([[entries]])")
    entries: list[LoreEntry] = []
    problems: list[str] = []
    for index, item in enumerate(raw):
        where = f"{source} entry #{index + 1}"
        unknown = sorted(set(item) - _ENTRY_KEYS)
        if unknown:
            problems.append(f"{where} has unknown keys {', '.join(unknown)} (valid: keys, content, priority, selective)")
            continue
        keys = item.get("keys")
        if not isinstance(keys, list):
            problems.append(f"{where}: keys must be a list of strings")
            continue
        keys = tuple(dict.fromkeys(k.strip() for k in keys if isinstance(k, str) and k.strip()))
        if not keys:
            problems.append(f"{where}: keys has no non-empty string, so it could never fire")
            continue
        content = item.get("content")
        if not isinstance(content, str) or not content.strip():
            problems.append(f"{where}: content must be a non-empty string")
            continue
        priority = item.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            problems.append(f"{where}: priority must be an integer, got {priority!r}")
            continue
        selective = item.get("selective", False)
        if not isinstance(selective, bool):
            problems.append(f"{where}: selective must be true or false, got {selective!r}")
            continue
        entries.append(LoreEntry(index, keys, content.strip(), priority, selective,
                                 tuple(key_pattern(k) for k in keys)))
    return entries, problems


class Lorebook:
    """One familiar's lorebook file, re-read when its bytes change. Thread-safe."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple | None = None  # (mtime_ns, size) of what was last read
        self._seen_hash: str | None = None  # hash of the last bytes parsed, good or bad
        self.entries: tuple[LoreEntry, ...] = ()
        self.file_hash = "none"  # hash of the file the entries came from
        self.last_error: str | None = None

    def current(self) -> tuple[str, tuple[LoreEntry, ...]]:
        """``(hash of the good file in use, entries)``, reloading if the file changed."""
        with self._lock:
            self._maybe_reload()
            return self.file_hash, self.entries

    def _maybe_reload(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            if self._stamp is not None or self.file_hash != "none":
                log.info("lorebook %s removed; no entries", self.path)
            self._stamp, self._seen_hash, self.entries, self.file_hash = None, None, (), "none"
            self.last_error = None
            return
        except OSError as exc:
            self._problem(f"cannot stat {self.path}: {exc}")
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self._problem(f"cannot read {self.path}: {exc}")
            return
        self._stamp = stamp
        digest = content_hash(data)
        if digest == self._seen_hash:
            return
        self._seen_hash = digest
        try:
            entries, problems = parse_lorebook(data.decode("utf-8", "replace"), str(self.path))
        except LorebookError as exc:
            kept = f"keeping the previous {len(self.entries)} entries" if self.entries else "no entries in use"
            self._problem(f"{exc}; {kept}")
            return
        for problem in problems:
            log.warning("lorebook: skipping %s", problem)
        self.entries, self.file_hash, self.last_error = tuple(entries), digest, None

    def _problem(self, message: str) -> None:
        if message != self.last_error:
            log.warning("lorebook: %s", message)
        self.last_error = message


def select_entries(entries, haystack: str, *, max_entries: int) -> list[LoreEntry]:
    """Matching entries, highest priority first (file order breaks ties), at most ``max_entries``."""
    if max_entries <= 0 or not haystack:
        return []
    folded = haystack.casefold()
    hits = [e for e in entries if e.matches(folded)]
    hits.sort(key=lambda e: (-e.priority, e.index))
    return hits[:max_entries]
