"""The turn log: one SQLite file per familiar, the source of truth for all memory.

``data/familiars/<id>/turns.db`` is written only by the bot (one writer process) and
read by pipeline runs in other processes. Every projection (summaries, facts, indexes,
...) is rebuilt from it, so this module keeps it boring and hard to corrupt:

* WAL mode with ``synchronous=NORMAL``: readers never block the writer and vice versa;
  a commit costs no fsync (a power cut can lose the last few turns, never the file).
* Turns are append-only. Edits and deletions are recorded *as such*: the turn row gets
  a new ``revision`` / ``deleted_at`` tombstone (content kept until memory has followed it and
  the retention ends: ``purged_at``, `familiar_pipeline.erasure`) and a row in
  ``turn_changes``, whose ``seq`` is a monotone cursor projections follow to converge.
* Every value is validated before any SQL runs, so a rejected write leaves nothing
  half-written. Timestamps are stored as fixed-width UTC ISO-8601 text, so string
  order is time order in SQL.
* ``PRAGMA user_version`` is the schema version; forward migrations run on a read-write
  open, all in one transaction, each idempotent. Read-only opens never migrate.

One module (~1k lines) because it is one file's contract: its schema, validation, writes
and reads share one connection discipline (one writer, WAL readers, the change cursor), and
spreading them would let a write skip the checks the others rely on.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import secrets
import sqlite3
import threading
from bisect import bisect_left
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, overload

from familiar_pipeline.storage.identity import check_key, is_ego_key
from familiar_pipeline.storage.private import private_dir, private_file
from familiar_pipeline.storage.scopes import check_turn_scope, turn_scope_sql
from familiar_pipeline.storage.times import utc_text
from familiar_pipeline.storage.wipe import vacuum
from familiar_pipeline.storage.words import distinctive_words, holds_any, redact

SCHEMA_VERSION = 5
ROLES = ("user", "assistant", "system", "tool")
MAX_CONTENT_BYTES = 1024 * 1024
BUSY_TIMEOUT_MS = 5000
_SQLITE_INT_MIN, _SQLITE_INT_MAX = -(2**63), 2**63 - 1


class TurnLogError(ValueError):
    """A turn-log problem, worded for the operator or the caller that caused it."""


class TurnLogUnavailable(TurnLogError):
    """The turn log cannot take a write (or be opened) right now: disk full, I/O error, locked.

    Nothing was written, and the same write may succeed later: the bot keeps such a
    message (`familiar_bot.responder.writes`) instead of dropping it, unlike a `TurnLogError`
    for a value that is wrong in itself.
    """


# SQLite result codes (and extended codes starting with them) that say "the storage
# refused", not "this value is wrong": the same statement can succeed once it is fixed.
_UNAVAILABLE_CODES = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN",
                      "SQLITE_READONLY")
FULL_DISK_FREE_BYTES = 1024 * 1024  # an I/O error with less than this free is a full disk


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) and str(getattr(exc, "sqlite_errorname", "")).startswith(_UNAVAILABLE_CODES)


def _free_bytes(folder: Path) -> int | None:
    """Bytes this account may still write on the file system holding `folder` (None: unknown)."""
    for candidate in (folder, *folder.parents):
        try:
            vfs = os.statvfs(candidate)
        except OSError:
            continue
        return vfs.f_bavail * vfs.f_frsize
    return None


def storage_problem(path: Path | str, exc: BaseException) -> str:
    """What went wrong with the file system under a SQLite error, in words an operator acts on.

    A full disk shows as SQLITE_FULL on a write, but as "disk I/O error" when the WAL's
    shared-memory file cannot grow (opening a log on a full disk): either, with less than
    FULL_DISK_FREE_BYTES free, is named for what it is, with the free space seen.
    """
    name = str(getattr(exc, "sqlite_errorname", ""))
    free = _free_bytes(Path(path).parent) if isinstance(path, Path) else None
    if name.startswith(("SQLITE_FULL", "SQLITE_IOERR")) and free is not None and free < FULL_DISK_FREE_BYTES:
        return f"the disk holding it is full ({free:,} bytes free); free some space ({exc})"
    return str(exc)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Turn:
    id: int
    channel_id: int
    guild_id: int | None
    role: str
    author_key: str | None
    author_display: str | None
    content: str
    mode: str | None
    platform_message_id: str | None
    reply_to_message_id: str | None
    created_at: datetime
    revision: int
    edited_at: datetime | None
    deleted_at: datetime | None
    reply_to_turn_id: int | None = None  # an assistant turn: the turn it answers (an erasure of that turn erases it)

    @property
    def deleted(self) -> bool:
        return self.deleted_at is not None

    @property
    def label(self) -> str:
        """The name to show for the speaker when no better resolution is at hand."""
        return self.author_display or self.author_key or self.role


@dataclass(frozen=True)
class TurnChange:
    seq: int
    turn_id: int
    kind: str  # "edit" | "delete"
    revision: int  # edit: the new revision; delete: the revision that was deleted
    at: datetime
    prior_content: str | None = None  # edit only: the text before the edit


def as_they_were(changes: Iterable[TurnChange], now: Mapping[int, Turn]) -> list[tuple[Turn, str | None]]:
    """Each changed turn as it read before its change (an edit's prior text; a deleted turn's
    last), with what it reads now (None: deleted), once per distinct earlier text, in change
    order: what a rewrite that takes the old words out must be shown. ``now``: the turns by id."""
    found: dict[tuple[int, str], tuple[Turn, str | None]] = {}
    for change in changes:
        turn = now[change.turn_id]
        was = replace(turn, content=change.prior_content or "") if change.kind == "edit" else turn
        found[(turn.id, was.content)] = (was, None if turn.deleted else turn.content)
    return list(found.values())


@dataclass(frozen=True)
class Participant:
    canonical_key: str
    platform: str
    user_id: str
    username: str | None
    global_name: str | None
    pronouns: str | None
    bio: str | None
    first_seen_at: datetime
    last_seen_at: datetime


# An erasure's target naming a turn by its id, for a turn with no platform message id (the console's).
TURN_TARGET = "turn:"


class NothingToErase(TurnLogError):
    """An erasure named a person or message the log does not hold (its message names near matches)."""


@dataclass(frozen=True)
class Erasure:
    """One request to forget, as the erasure log keeps it: who asked, when, which turns. No text."""

    id: int
    requested_at: datetime
    requested_by: str
    kind: str  # "person" | "message"
    target: str  # the canonical key, or the platform message id
    scope: str | None  # None: everywhere
    turn_ids: tuple[int, ...]
    status: str  # "pending" | "done"
    done_at: datetime | None
    replies_erased: tuple[int, ...] = ()  # the familiar's replies to its turns, erased with them
    replies_redacted: tuple[int, ...] = ()  # the familiar's other replies that repeated its words, redacted
    check: "ErasureCheck | None" = None  # what the scan after the purge found (None: not scanned yet)


@dataclass(frozen=True)
class ErasureCheck:
    """The scan after a purge (`familiar_pipeline.erasure.verify`): how many distinctive words it looked
    for, in how many files, and the files still holding any (paths, never the words)."""

    words: int
    files: int
    left: tuple[str, ...]
    at: datetime


# Where the turn log keeps what people said (the check after an erasure's purge reads these):
# table -> its free-text columns. Keys, ids, scopes and times are not words anyone said.
PROSE_COLUMNS: dict[str, tuple[str, ...]] = {
    "turns": ("content", "author_display"),
    "turn_changes": ("prior_content",),
    "participants": ("username", "global_name", "pronouns", "bio"),
    "guild_nicks": ("nick",),
}




def kept_prose(turn_ids: Iterable[int] = (), edits: Iterable[int] = (), people: Iterable[str] = ()
               ) -> dict[str, tuple[str, list[str]]]:
    """Per table of `PROSE_COLUMNS`, the SQL condition (and its parameters) of the rows whose text a
    purge of these turns, edits (`turn_changes` seqs) and people's profiles keeps (`TurnLog.purge_text`,
    `purge_prior_texts`): what an erasure's distinctive words are measured against, and where the
    check after it looks."""
    turns, seqs, keys = json.dumps(sorted(turn_ids)), json.dumps(sorted(edits)), json.dumps(sorted(people))
    outside = "NOT IN (SELECT value FROM json_each(?))"
    return {"turns": (f"id {outside}", [turns]),
            "turn_changes": (f"turn_id {outside} AND seq {outside}", [turns, seqs]),
            "participants": (f"canonical_key {outside}", [keys]),
            "guild_nicks": (f"canonical_key {outside}", [keys])}


# --------------------------------------------------------------------------- schema

_V1 = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel_id INTEGER NOT NULL,
    guild_id INTEGER,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    author_key TEXT,
    author_display TEXT,
    content TEXT NOT NULL,
    mode TEXT,
    platform_message_id TEXT,
    reply_to_message_id TEXT,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS turns_channel_tail ON turns (channel_id, id);
CREATE INDEX IF NOT EXISTS turns_platform_message
    ON turns (platform_message_id) WHERE platform_message_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS turns_author ON turns (author_key, id) WHERE author_key IS NOT NULL;

CREATE TABLE IF NOT EXISTS participants (
    canonical_key TEXT PRIMARY KEY,
    platform TEXT NOT NULL,
    user_id TEXT NOT NULL,
    username TEXT,
    global_name TEXT,
    pronouns TEXT,
    bio TEXT,
    first_seen_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS guild_nicks (
    canonical_key TEXT NOT NULL,
    guild_id INTEGER NOT NULL,
    nick TEXT,
    last_seen_at TEXT NOT NULL,
    PRIMARY KEY (canonical_key, guild_id)
);

CREATE TABLE IF NOT EXISTS turn_mentions (
    turn_id INTEGER NOT NULL REFERENCES turns (id),
    canonical_key TEXT NOT NULL,
    PRIMARY KEY (turn_id, canonical_key)
);
CREATE INDEX IF NOT EXISTS turn_mentions_by_key ON turn_mentions (canonical_key, turn_id);
"""

_V2_TABLES = """
CREATE TABLE IF NOT EXISTS turn_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id INTEGER NOT NULL REFERENCES turns (id),
    kind TEXT NOT NULL CHECK (kind IN ('edit', 'delete')),
    revision INTEGER NOT NULL,
    prior_content TEXT,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS turn_changes_by_turn ON turn_changes (turn_id, seq);
"""


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT the migration transaction; run statements one by one.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _migrate_to_v1(conn: sqlite3.Connection) -> None:
    """Turns, participants, guild nicknames and mentions."""
    _run_script(conn, _V1)


def _migrate_to_v2(conn: sqlite3.Connection) -> None:
    """Edits and deletions as first-class records: revision, tombstone, change log."""
    existing = _columns(conn, "turns")
    for column, ddl in (
        ("revision", "ALTER TABLE turns ADD COLUMN revision INTEGER NOT NULL DEFAULT 0"),
        ("edited_at", "ALTER TABLE turns ADD COLUMN edited_at TEXT"),
        ("deleted_at", "ALTER TABLE turns ADD COLUMN deleted_at TEXT"),
    ):
        if column not in existing:  # idempotent: a half-migrated file may have some already
            conn.execute(ddl)
    _run_script(conn, _V2_TABLES)


def _migrate_to_v3(conn: sqlite3.Connection) -> None:
    """A random id for this log, minted once: a familiar deleted and created again under the
    same name starts a new log, and whatever is keyed by turn ids (Dagster run keys) must not
    mistake its turns for the old log's."""
    conn.execute("CREATE TABLE IF NOT EXISTS log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT OR IGNORE INTO log_meta VALUES ('log_id', ?)", (secrets.token_hex(4),))


_V4_TABLES = """
CREATE TABLE IF NOT EXISTS erasures (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    requested_at TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('person', 'message')),
    target TEXT NOT NULL,
    scope TEXT,
    turn_count INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'done')),
    done_at TEXT
);
CREATE TABLE IF NOT EXISTS erasure_turns (
    erasure_id INTEGER NOT NULL REFERENCES erasures (id),
    turn_id INTEGER NOT NULL REFERENCES turns (id),
    PRIMARY KEY (erasure_id, turn_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS forgotten_people (
    canonical_key TEXT NOT NULL,
    scope TEXT NOT NULL,
    erasure_id INTEGER NOT NULL REFERENCES erasures (id),
    upto_turn_id INTEGER NOT NULL,
    PRIMARY KEY (canonical_key, scope)
)
"""


def _migrate_to_v4(conn: sqlite3.Connection) -> None:
    """Erasure on request: the erasure log (who asked, when, which turn ids; never text), the people
    forgotten (for what their later messages do), and when a turn's text was purged."""
    if "purged_at" not in _columns(conn, "turns"):
        conn.execute("ALTER TABLE turns ADD COLUMN purged_at TEXT")
    _run_script(conn, _V4_TABLES)
    conn.execute("CREATE INDEX IF NOT EXISTS turns_unpurged_deleted ON turns (deleted_at) "
                 "WHERE deleted_at IS NOT NULL AND purged_at IS NULL")


_V5_TABLES = """
CREATE TABLE IF NOT EXISTS erasure_replies (
    erasure_id INTEGER NOT NULL REFERENCES erasures (id),
    turn_id INTEGER NOT NULL REFERENCES turns (id),
    action TEXT NOT NULL CHECK (action IN ('erased', 'redacted')),
    PRIMARY KEY (erasure_id, turn_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS erasure_replies_by_turn ON erasure_replies (turn_id);
CREATE INDEX IF NOT EXISTS turns_reply_to_turn ON turns (reply_to_turn_id) WHERE reply_to_turn_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS turn_changes_prior ON turn_changes (at) WHERE prior_content IS NOT NULL
"""


def _migrate_to_v5(conn: sqlite3.Connection) -> None:
    """The familiar's replies follow an erasure: the turn a reply answers, the replies an erasure
    erased or redacted, and what the scan after its purge found (counts and paths, never words).

    Replies written before this have no answered turn: a Discord reply's is the user turn of its
    `reply_to_message_id`; a reply without one (the console's) is taken to answer the newest user
    turn of its channel before it, as the console answers each line.
    """
    if "reply_to_turn_id" not in _columns(conn, "turns"):
        conn.execute("ALTER TABLE turns ADD COLUMN reply_to_turn_id INTEGER")
        conn.execute(
            "UPDATE turns SET reply_to_turn_id = coalesce("
            "(SELECT max(u.id) FROM turns u WHERE u.platform_message_id = turns.reply_to_message_id "
            "AND u.role = 'user' AND u.id < turns.id), "
            "CASE WHEN turns.reply_to_message_id IS NULL THEN (SELECT max(u.id) FROM turns u "
            "WHERE u.channel_id = turns.channel_id AND u.id < turns.id AND u.role = 'user') END) "
            "WHERE role = 'assistant'")
    existing = _columns(conn, "erasures")
    for column, kind in (("check_words", "INTEGER"), ("check_files", "INTEGER"), ("check_left", "TEXT"),
                         ("checked_at", "TEXT")):
        if column not in existing:
            conn.execute(f"ALTER TABLE erasures ADD COLUMN {column} {kind}")
    _run_script(conn, _V5_TABLES)


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _migrate_to_v1,
    2: _migrate_to_v2,
    3: _migrate_to_v3,
    4: _migrate_to_v4,
    5: _migrate_to_v5,
}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


# --------------------------------------------------------------------------- validation


@overload
def _check_int(value: Any, field: str, *, optional: Literal[False] = ...) -> int: ...
@overload
def _check_int(value: Any, field: str, *, optional: bool) -> int | None: ...
def _check_int(value: Any, field: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    # bool is an int subclass; True as a channel id is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TurnLogError(f"{field} must be an integer, got {type(value).__name__} {value!r}")
    if not _SQLITE_INT_MIN <= value <= _SQLITE_INT_MAX:
        raise TurnLogError(f"{field} {value} does not fit in a signed 64-bit integer")
    return value


def _check_text(
    value: Any, field: str, *, optional: bool = True, max_bytes: int | None = None
) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TurnLogError(f"{field} must be a string, got {type(value).__name__}")
    try:
        encoded_len = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise TurnLogError(
            f"{field} contains a lone UTF-16 surrogate ({value[exc.start]!r} at position "
            f"{exc.start}) and cannot be stored as UTF-8; nothing was written"
        ) from None
    if max_bytes is not None and encoded_len > max_bytes:
        raise TurnLogError(
            f"{field} is {encoded_len} bytes of UTF-8; the limit is {max_bytes} bytes (1 MiB)"
        )
    return value


def _check_message_id(value: Any, field: str) -> str | None:
    """Platform message ids are snowflakes on Discord; stored as text so any platform fits."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = _check_text(value, field)
    if not text:
        raise TurnLogError(f"{field} must not be empty (use None when there is none)")
    return text


def _check_scope(value: Any) -> str:
    try:
        return check_turn_scope(value)
    except ValueError as exc:
        raise TurnLogError(str(exc)) from None


def _check_key(key: Any, field: str = "canonical key") -> str:
    try:
        return check_key(key, field)
    except ValueError as exc:
        raise TurnLogError(str(exc)) from None


def _check_ids(ids: Iterable[Any], field: str) -> list[int]:
    return sorted({_check_int(i, field) for i in ids})


def _utc_text(value: Any, field: str) -> str:
    """Any accepted timestamp (None: now) -> fixed-width UTC text, so string order is time order."""
    try:
        return utc_text(value, what=field)
    except (TypeError, ValueError) as exc:
        raise TurnLogError(str(exc)) from None


def _parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


# --------------------------------------------------------------------------- rows

_TURN_COLUMNS = (
    "id, channel_id, guild_id, role, author_key, author_display, content, mode, "
    "platform_message_id, reply_to_message_id, created_at, revision, edited_at, deleted_at, reply_to_turn_id"
)
_PARTICIPANT_COLUMNS = (
    "canonical_key, platform, user_id, username, global_name, pronouns, bio, "
    "first_seen_at, last_seen_at"
)
_APPEND_FIELDS = frozenset(
    {
        "channel_id", "role", "content", "author_key", "author_display", "guild_id", "mode",
        "platform_message_id", "reply_to_message_id", "reply_to_turn_id", "created_at", "mentions",
    }
)
_INSERT_TURN = (
    "INSERT INTO turns (channel_id, guild_id, role, author_key, author_display, content, mode, "
    "platform_message_id, reply_to_message_id, created_at, reply_to_turn_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


# A turn `{t}` said by a forgotten person after they were forgotten, in the scope they were forgotten in.
_FORGOTTEN_AUTHOR = (
    "EXISTS (SELECT 1 FROM forgotten_people f WHERE f.canonical_key = {t}.author_key "
    "AND {t}.id > f.upto_turn_id AND (f.scope = '*' OR f.scope = CASE WHEN {t}.guild_id IS NOT NULL "
    "THEN 'guild:' || {t}.guild_id ELSE 'channel:' || {t}.channel_id END))"
)
# ... or the familiar's reply to such a turn: memory never reads it either, and it is purged with it.
_SAID_AFTER_FORGOTTEN = (
    f"({_FORGOTTEN_AUTHOR.format(t='turns')} OR (turns.reply_to_turn_id IS NOT NULL AND EXISTS "
    f"(SELECT 1 FROM turns a WHERE a.id = turns.reply_to_turn_id AND {_FORGOTTEN_AUTHOR.format(t='a')})))"
)


# A row of _TURN_COLUMNS / _PARTICIPANT_COLUMNS as SQLite returns it (times as ISO text).
_TurnRow = tuple[int, int, int | None, str, str | None, str | None, str, str | None, str | None, str | None,
                 str, int, str | None, str | None, int | None]
_ParticipantRow = tuple[str, str, str, str | None, str | None, str | None, str | None, str, str]


def _turn_from_row(row: _TurnRow) -> Turn:
    # Columns in _TURN_COLUMNS order, which is Turn's field order.
    return Turn(*row[:10], created_at=datetime.fromisoformat(row[10]), revision=row[11],
                edited_at=_parse_time(row[12]), deleted_at=_parse_time(row[13]), reply_to_turn_id=row[14])


def _participant_from_row(row: _ParticipantRow) -> Participant:
    # Columns in _PARTICIPANT_COLUMNS order, which is Participant's field order; both times are NOT NULL.
    return Participant(*row[:7], first_seen_at=datetime.fromisoformat(row[7]), last_seen_at=datetime.fromisoformat(row[8]))


@dataclass(frozen=True)
class _PendingTurn:
    """A validated append, ready to insert: the SQL parameters plus its mentions."""

    params: tuple
    mentions: tuple[str, ...]


def _validate_append(
    *,
    channel_id: Any,
    role: Any,
    content: Any,
    author_key: Any = None,
    author_display: Any = None,
    guild_id: Any = None,
    mode: Any = None,
    platform_message_id: Any = None,
    reply_to_message_id: Any = None,
    reply_to_turn_id: Any = None,
    created_at: Any = None,
    mentions: Iterable[str] = (),
) -> _PendingTurn:
    _check_int(channel_id, "channel_id")
    if role not in ROLES:
        raise TurnLogError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    _check_text(content, "content", optional=False, max_bytes=MAX_CONTENT_BYTES)
    if author_key is not None:
        _check_key(author_key, "author_key")
    return _PendingTurn(
        params=(
            channel_id,
            _check_int(guild_id, "guild_id", optional=True),
            role,
            author_key,
            _check_text(author_display, "author_display"),
            content,
            _check_text(mode, "mode"),
            _check_message_id(platform_message_id, "platform_message_id"),
            _check_message_id(reply_to_message_id, "reply_to_message_id"),
            _utc_text(created_at, "created_at"),
            _check_int(reply_to_turn_id, "reply_to_turn_id", optional=True),
        ),
        mentions=_mentionable(mentions),
    )


def _mentionable(keys: Iterable[Any] | None) -> tuple[str, ...]:
    """Validated, deduplicated, sorted mention keys.

    The familiar's own ego key is dropped: mentions link turns to participant accounts,
    and the familiar being addressed is not one.
    """
    if keys is None:
        return ()
    if isinstance(keys, str):
        raise TurnLogError("mentions must be a collection of canonical keys, not a single string")
    valid = {_check_key(k, "mention key") for k in keys}
    return tuple(sorted(k for k in valid if not is_ego_key(k)))


# --------------------------------------------------------------------------- the log


class TurnLog:
    """One familiar's turn log. One instance per process; safe to share between threads."""

    def __init__(self, path: str | Path, *, readonly: bool = False, hide_forgotten: bool = False):
        """``hide_forgotten``: reads leave out the turns that people forgotten with the "opt_out"
        setting said after they were forgotten (what memory is built from; docs/privacy.md)."""
        self.path = path if str(path) == ":memory:" else Path(path)
        self.readonly = readonly
        self.hide_forgotten = hide_forgotten
        self._lock = threading.RLock()
        self._in_snapshot = False
        self._conn: sqlite3.Connection | None = None
        self._conn = self._open_readonly() if readonly else self._open_writer()

    # -- opening

    def _connect(self, target: str, *, uri: bool) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                target,
                uri=uri,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # guarded by self._lock instead
                timeout=BUSY_TIMEOUT_MS / 1000,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise self._open_error(exc, "cannot open turn log") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            conn.close()
            if _unavailable(exc):  # the file may be fine: the disk or a lock is not
                raise self._open_error(exc, "cannot open turn log") from exc
            raise TurnLogError(f"{self.path} is not a usable SQLite turn log: {exc}") from exc
        if version > SCHEMA_VERSION:
            conn.close()
            raise TurnLogError(
                f"{self.path} has turn-log schema version {version}, newer than this code "
                f"knows ({SCHEMA_VERSION}); upgrade familiar before opening it"
            )
        return conn

    def _open_error(self, exc: sqlite3.Error, what: str) -> TurnLogError:
        """One line naming the log and the cause; TurnLogUnavailable when the storage is the cause."""
        kind = TurnLogUnavailable if _unavailable(exc) else TurnLogError
        return kind(f"{what} {self.path}: {storage_problem(self.path, exc)}")

    def _open_writer(self) -> sqlite3.Connection:
        if isinstance(self.path, Path):
            try:
                # Private: the log holds direct messages (storage/private.py). SQLite gives the
                # WAL and SHM files the mode of the log itself.
                private_dir(self.path.parent)
                private_file(self.path)
                for side in (self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm")):
                    if side.exists():  # left by an earlier version with looser modes
                        private_file(side)
            except OSError as exc:
                kind = TurnLogUnavailable if exc.errno in (errno.ENOSPC, errno.EDQUOT) else TurnLogError
                raise kind(f"cannot create turn log {self.path}: {exc.strerror or exc}") from exc
        conn = self._connect(str(self.path), uri=False)
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal" and isinstance(self.path, Path):
                raise TurnLogError(f"could not switch {self.path} to WAL mode (got {mode!r})")
            conn.execute("PRAGMA synchronous = NORMAL")
            # Deleted and overwritten text is zeroed in the file, not left in free space: a purged
            # turn's words must not stay on disk (docs/privacy.md).
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise self._open_error(exc, "cannot prepare turn log") from exc
        except TurnLogError:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another opener may have migrated meanwhile.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for target in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[target](conn)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            self._rollback(conn)
            raise

    def _open_readonly(self) -> sqlite3.Connection:
        if not isinstance(self.path, Path):
            raise TurnLogError("a read-only turn log needs a file path, not ':memory:'")
        if not self.path.is_file():
            raise TurnLogError(f"turn log {self.path} does not exist (the bot creates it)")
        conn = self._connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:
            conn.close()
            raise TurnLogError(
                f"{self.path} has turn-log schema version {version}, older than this code "
                f"({SCHEMA_VERSION}); open it read-write once (starting the bot does) to migrate"
            )
        conn.execute("PRAGMA query_only = ON")
        return conn

    # -- plumbing

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "TurnLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else ("read-only" if self.readonly else "read-write")
        return f"TurnLog({str(self.path)!r}, {state})"

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise TurnLogError(f"turn log {self.path} is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; anything raised rolls it back whole."""
        with self._lock:
            conn = self._live()
            if self.readonly:
                raise TurnLogError(f"turn log {self.path} was opened read-only")
            if self._in_snapshot:
                raise TurnLogError("cannot write inside a read snapshot")
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(conn)
                kind = TurnLogUnavailable if _unavailable(exc) else TurnLogError
                raise kind(f"write to {self.path} failed and was rolled back: {storage_problem(self.path, exc)}") from exc
            except BaseException:
                self._rollback(conn)
                raise

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        """Undo what is left of a failed write transaction.

        After SQLITE_FULL (and some I/O errors) SQLite has already rolled the whole
        transaction back; a second ROLLBACK would raise "no transaction is active" and
        hide the real error, so it is issued only while a transaction is open.
        """
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:  # the connection reports the original failure; SQLite undoes on close
                pass

    def _query(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._live().execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise TurnLogError(f"read from {self.path} failed: {exc}") from exc

    def _turns(self, where: str, params: tuple | list = (), tail: str = "ORDER BY id") -> list[Turn]:
        if self.hide_forgotten:
            where = f"({where}) AND NOT {_SAID_AFTER_FORGOTTEN}"
        rows = self._query(f"SELECT {_TURN_COLUMNS} FROM turns WHERE {where} {tail}", params)
        return [_turn_from_row(r) for r in rows]

    @contextmanager
    def snapshot(self) -> Iterator["TurnLog"]:
        """Read several things from one consistent state (a single read transaction).

        A projection that reads ``turns_after(w)`` and ``latest_change_seq()`` inside one
        snapshot sees no append or edit that lands between the two calls.
        """
        with self._lock:
            conn = self._live()
            if self._in_snapshot:
                yield self
                return
            conn.execute("BEGIN DEFERRED")
            self._in_snapshot = True
            try:
                yield self
            finally:
                self._in_snapshot = False
                conn.execute("COMMIT")

    # -- appending

    def append_turn(
        self,
        *,
        channel_id: int,
        role: str,
        content: str,
        author_key: str | None = None,
        author_display: str | None = None,
        guild_id: int | None = None,
        mode: str | None = None,
        platform_message_id: str | int | None = None,
        reply_to_message_id: str | int | None = None,
        reply_to_turn_id: int | None = None,
        created_at: datetime | None = None,
        mentions: Iterable[str] = (),
    ) -> Turn:
        """Append one turn. An assistant turn names the turn it answers (``reply_to_turn_id``): a reply
        to a turn already erased (an erasure recorded while the reply was composed) is stored erased
        with it, blank, so it never holds the words the erasure took out."""
        pending = _validate_append(
            channel_id=channel_id, role=role, content=content, author_key=author_key,
            author_display=author_display, guild_id=guild_id, mode=mode,
            platform_message_id=platform_message_id, reply_to_message_id=reply_to_message_id,
            reply_to_turn_id=reply_to_turn_id, created_at=created_at, mentions=mentions,
        )
        with self._write() as conn:
            turn_id = self._insert(conn, pending)
        return self._appended(turn_id, pending)

    def append_turns(self, rows: Iterable[dict]) -> list[Turn]:
        """Bulk import: every row is validated first, then all are written in one transaction.

        A reply in the batch may name the turn it answers by its position in the batch
        (``reply_to_row``, an earlier row) rather than by id: an imported transcript's replies
        answer lines written in the same transaction, whose ids are known only as they are inserted.
        """
        pending: list[_PendingTurn] = []
        answers_row: list[int | None] = []
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise TurnLogError(f"row {index}: expected a dict, got {type(row).__name__}")
            row = dict(row)
            reply_to_row = row.pop("reply_to_row", None)
            unknown = set(row) - _APPEND_FIELDS
            if unknown:
                raise TurnLogError(f"row {index}: unknown field(s) {', '.join(sorted(unknown))}")
            if reply_to_row is not None and (type(reply_to_row) is not int or not 0 <= reply_to_row < index
                                             or row.get("reply_to_turn_id") is not None):
                raise TurnLogError(f"row {index}: reply_to_row must be the position of an earlier row of the batch "
                                   f"(and no reply_to_turn_id with it), got {reply_to_row!r}")
            try:
                pending.append(_validate_append(**row))
            except TypeError as exc:  # a required field is missing
                raise TurnLogError(f"row {index}: {exc}") from None
            except TurnLogError as exc:
                raise TurnLogError(f"row {index}: {exc}") from None
            answers_row.append(reply_to_row)
        if not pending:
            return []
        with self._write() as conn:
            ids: list[int] = []
            for index, p in enumerate(pending):
                if (row_answered := answers_row[index]) is not None:
                    params = list(p.params)
                    params[10] = ids[row_answered]
                    p = pending[index] = _PendingTurn(tuple(params), p.mentions)
                ids.append(self._insert(conn, p))
        return [self._appended(i, p) for i, p in zip(ids, pending)]

    def _appended(self, turn_id: int, pending: _PendingTurn) -> Turn:
        """The turn as written: built from the values (no read-back), but for a reply stored erased."""
        if pending.params[2] == "assistant" and pending.params[10] is not None:
            return _turn_from_row(self._query(f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = ?", (turn_id,))[0])
        return self._pending_to_turn(turn_id, pending)

    @staticmethod
    def _insert(conn: sqlite3.Connection, pending: _PendingTurn) -> int:
        answers = pending.params[10]
        erasure = None
        if answers is not None and pending.params[2] == "assistant":
            erasure = conn.execute(
                "SELECT erasure_id FROM erasure_turns WHERE turn_id = ? UNION ALL SELECT erasure_id FROM "
                "erasure_replies WHERE turn_id = ? AND action = 'erased' LIMIT 1", (answers, answers)).fetchone()
        if erasure is not None:  # answers an erased turn: erased with it, never holding its words
            params = list(pending.params)
            params[5] = ""
            pending = _PendingTurn(tuple(params), pending.mentions)
        turn_id = conn.execute(_INSERT_TURN, pending.params).lastrowid
        assert turn_id is not None  # set by the INSERT
        if erasure is not None:
            conn.execute("UPDATE turns SET deleted_at = created_at, purged_at = created_at WHERE id = ?", (turn_id,))
            conn.execute("INSERT OR IGNORE INTO erasure_replies VALUES (?, ?, 'erased')", (erasure[0], turn_id))
        if pending.mentions:
            conn.executemany(
                "INSERT OR IGNORE INTO turn_mentions (turn_id, canonical_key) VALUES (?, ?)",
                [(turn_id, key) for key in pending.mentions],
            )
        return turn_id

    @staticmethod
    def _pending_to_turn(turn_id: int, pending: _PendingTurn) -> Turn:
        # Built from the exact values written, which saves a read-back per append.
        p = pending.params
        return Turn(
            id=turn_id, channel_id=p[0], guild_id=p[1], role=p[2], author_key=p[3],
            author_display=p[4], content=p[5], mode=p[6], platform_message_id=p[7],
            reply_to_message_id=p[8], created_at=datetime.fromisoformat(p[9]),
            revision=0, edited_at=None, deleted_at=None, reply_to_turn_id=p[10],
        )

    # -- edits and deletions

    def _locate(self, conn: sqlite3.Connection, turn_id: Any, platform_message_id: Any) -> Turn | None:
        if (turn_id is None) == (platform_message_id is None):
            raise TurnLogError("give exactly one of turn_id or platform_message_id")
        if turn_id is not None:
            _check_int(turn_id, "turn_id")
            sql, param = f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = ?", turn_id
        else:
            # Message ids are unique per platform; should a message have been logged twice,
            # the latest copy is the one the edit or deletion applies to.
            param = _check_message_id(platform_message_id, "platform_message_id")
            sql = (
                f"SELECT {_TURN_COLUMNS} FROM turns WHERE platform_message_id = ? "
                "ORDER BY id DESC LIMIT 1"
            )
        row = conn.execute(sql, (param,)).fetchone()
        return None if row is None else _turn_from_row(row)

    @staticmethod
    def _log_change(conn: sqlite3.Connection, turn_id: int, kind: str, revision: int,
                    prior_content: str | None, at: str) -> None:
        conn.execute(
            "INSERT INTO turn_changes (turn_id, kind, revision, prior_content, at) VALUES (?, ?, ?, ?, ?)",
            (turn_id, kind, revision, prior_content, at),
        )

    def record_edit(
        self,
        *,
        turn_id: int | None = None,
        platform_message_id: str | int | None = None,
        new_content: str,
        edited_at: datetime | None = None,
    ) -> Turn | None:
        """Replace a turn's text, keeping the prior text in ``turn_changes``.

        Returns None when no such turn exists. An edit that does not change the text
        (Discord sends those when embeds unfurl) and an edit of a deleted turn change
        nothing and return the turn as it stands.
        """
        _check_text(new_content, "new_content", optional=False, max_bytes=MAX_CONTENT_BYTES)
        at = _utc_text(edited_at, "edited_at")
        with self._write() as conn:
            current = self._locate(conn, turn_id, platform_message_id)
            if current is None or current.deleted or current.content == new_content:
                return current
            revision = current.revision + 1
            conn.execute(
                "UPDATE turns SET content = ?, revision = ?, edited_at = ? WHERE id = ?",
                (new_content, revision, at, current.id),
            )
            self._log_change(conn, current.id, "edit", revision, current.content, at)
        return replace(current, content=new_content, revision=revision, edited_at=datetime.fromisoformat(at))

    def record_deletion(
        self,
        *,
        turn_id: int | None = None,
        platform_message_id: str | int | None = None,
        deleted_at: datetime | None = None,
    ) -> Turn | None:
        """Tombstone a turn: it counts as deleted at once; its content stays until the pipeline has
        followed the deletion and `[memory.privacy] deleted_retention_hours` passed (`purge_text`).

        Returns None when no such turn exists; deleting twice keeps the first tombstone.
        """
        at = _utc_text(deleted_at, "deleted_at")
        with self._write() as conn:
            current = self._locate(conn, turn_id, platform_message_id)
            if current is None or current.deleted:
                return current
            conn.execute("UPDATE turns SET deleted_at = ? WHERE id = ?", (at, current.id))
            self._log_change(conn, current.id, "delete", current.revision, None, at)
        return replace(current, deleted_at=datetime.fromisoformat(at))

    # -- erasure on request (docs/privacy.md; the steps after this one: familiar_pipeline.erasure)

    def request_erasure(
        self,
        *,
        kind: str,
        target: str,
        scope: str | None = None,
        requested_by: str,
        at: datetime | None = None,
    ) -> "Erasure":
        """Record an erasure and tombstone its turns, in one transaction; the erasure, pending.

        ``kind`` "person": every turn ``target`` (a canonical key) said, in ``scope`` if given,
        and the person is remembered as forgotten there (what their later messages do is the
        operator's setting). "message": the turn of platform message ``target``, or, for a turn no
        platform numbered (the console's), ``turn:<id>`` (`TURN_TARGET`). Each turn not
        deleted yet gets a deletion in ``turn_changes``, so every projection follows it as it
        follows any deletion; its text stays until the pipeline purges it (`purge_text`),
        after the projections that must quote it to take it out (a summary's redaction) did.
        Raises `NothingToErase` (naming near matches) when nothing matches.
        """
        if kind not in ("person", "message"):
            raise TurnLogError(f"erasure kind is 'person' or 'message', not {kind!r}")
        who = _check_text(requested_by, "requested_by", optional=False, max_bytes=200)
        assert who is not None  # not optional
        scope = None if scope in (None, "") else _check_scope(scope)
        stamp = _utc_text(at, "at")
        if kind == "person":
            key = _check_key(target, "person")
            where, params = "author_key = ? AND role = 'user'", list[int | str]([key])
        else:
            message = _check_message_id(target, "message id")
            if message is None:
                raise TurnLogError("message id must not be None")
            key = message
            where, params = "platform_message_id = ?", list[int | str]([key])
            if key.startswith(TURN_TARGET) and key[len(TURN_TARGET):].isdigit():
                where, params = "id = ?", [int(key[len(TURN_TARGET):])]
        if scope is not None:
            clause = turn_scope_sql([scope])
            assert clause is not None  # a guild or channel scope always matches by a clause
            where += f" AND {clause[0]}"
            params += clause[1]
        with self._write() as conn:
            rows = conn.execute(f"SELECT id, deleted_at, revision FROM turns WHERE {where} ORDER BY id", params).fetchall()
            known_person = kind == "person" and conn.execute(
                "SELECT 1 FROM participants WHERE canonical_key = ?", (key,)).fetchone() is not None
            if not rows and not known_person:
                raise NothingToErase(self._near_matches(conn, kind, key, scope))
            erasure_id = conn.execute(
                "INSERT INTO erasures (requested_at, requested_by, kind, target, scope, turn_count, status) "
                "VALUES (?, ?, ?, ?, ?, ?, 'pending')",
                (stamp, who, kind, key, scope, len(rows))).lastrowid
            assert erasure_id is not None
            conn.executemany("INSERT INTO erasure_turns VALUES (?, ?)", [(erasure_id, r[0]) for r in rows])
            for turn_id, deleted_at, revision in rows:
                if deleted_at is None:
                    conn.execute("UPDATE turns SET deleted_at = ? WHERE id = ?", (stamp, turn_id))
                    self._log_change(conn, turn_id, "delete", revision, None, stamp)
            erased, redacted = self._follow_replies(conn, erasure_id, [r[0] for r in rows], stamp)
            if kind == "person":
                upto = conn.execute("SELECT coalesce(max(id), 0) FROM turns").fetchone()[0]
                conn.execute("INSERT OR REPLACE INTO forgotten_people VALUES (?, ?, ?, ?)",
                             (key, scope or "*", erasure_id, upto))
        return Erasure(erasure_id, datetime.fromisoformat(stamp), who, kind, key, scope,
                       tuple(r[0] for r in rows), "pending", None, erased, redacted)

    def _follow_replies(self, conn: sqlite3.Connection, erasure_id: int, erased: list[int],
                        stamp: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The familiar's half of what is erased (docs/privacy.md): its replies to the erased turns
        are erased with them (tombstoned, purged with them); its later replies that repeat one of the
        erased turns' distinctive words are redacted, each word replaced by ``[erased]``, as an edit,
        so memory follows them as it follows any edit and the purge removes the earlier text.

        Distinctive: no text the log keeps uses the word (`kept_prose`: other people's turns, profiles,
        kept earlier revisions), nor a reply the familiar wrote before the first erased turn (its own
        words: its name, its turns of phrase). (erased, redacted) reply ids.
        """
        if not erased:
            return (), ()
        ids = json.dumps(erased)
        listed = "(SELECT value FROM json_each(?))"  # any number of ids, one parameter
        answering = [r for r in conn.execute(
            f"SELECT id, revision FROM turns r WHERE role = 'assistant' AND deleted_at IS NULL AND "
            f"(reply_to_turn_id IN {listed} OR (reply_to_turn_id IS NULL AND reply_to_message_id IN "
            f"(SELECT platform_message_id FROM turns WHERE id IN {listed})))", [ids, ids])]
        for turn_id, revision in answering:
            conn.execute("UPDATE turns SET deleted_at = ? WHERE id = ?", (stamp, turn_id))
            self._log_change(conn, turn_id, "delete", revision, None, stamp)
        conn.executemany("INSERT OR IGNORE INTO erasure_replies VALUES (?, ?, 'erased')",
                         [(erasure_id, r[0]) for r in answering])
        gone_ids = set(erased) | {r[0] for r in answering}
        texts: list[str] = []
        for content, name in conn.execute(f"SELECT content, author_display FROM turns WHERE id IN {listed}", [ids]):
            texts += [content, name or ""]
        texts += [r[0] for r in conn.execute(
            f"SELECT prior_content FROM turn_changes WHERE turn_id IN {listed} AND prior_content IS NOT NULL", [ids])]
        first = min(erased)
        if conn.execute("SELECT 1 FROM turns WHERE role = 'assistant' AND deleted_at IS NULL AND id > ? LIMIT 1",
                        (first,)).fetchone() is None:
            return tuple(r[0] for r in answering), ()  # no later reply could repeat them: no scan of the log
        # What the log keeps (as the purge measures it), but for the familiar's replies after the first
        # erased turn: those are what may repeat the words. Its name on them is its own.
        keep = kept_prose(gone_ids)
        where, params = keep["turns"]
        keep["turns"] = (f"{where} AND (role != 'assistant' OR id < ?)", [*params, str(first)])
        names = [r[0] for r in conn.execute("SELECT DISTINCT author_display FROM turns WHERE role = 'assistant' "
                                            "AND author_display IS NOT NULL")]
        words = frozenset(distinctive_words(texts, itertools.chain(names, self.texts_kept(keep))))
        redacted = []
        if words:
            for turn_id, content, revision in conn.execute(
                    "SELECT id, content, revision FROM turns WHERE role = 'assistant' AND deleted_at IS NULL "
                    "AND id > ?", (first,)).fetchall():
                if turn_id in gone_ids or not holds_any(content, words):
                    continue
                conn.execute("UPDATE turns SET content = ?, revision = ?, edited_at = ? WHERE id = ?",
                             (redact(content, words), revision + 1, stamp, turn_id))
                self._log_change(conn, turn_id, "edit", revision + 1, content, stamp)
                redacted.append(turn_id)
        conn.executemany("INSERT OR IGNORE INTO erasure_replies VALUES (?, ?, 'redacted')",
                         [(erasure_id, t) for t in redacted])
        return tuple(r[0] for r in answering), tuple(redacted)

    def _near_matches(self, conn: sqlite3.Connection, kind: str, target: str, scope: str | None) -> str:
        """The one-line error for an erasure that matched nothing, naming what it may have meant."""
        import difflib

        where = f" in {scope}" if scope else ""
        if kind == "person":
            known = [r[0] for r in conn.execute(
                "SELECT canonical_key FROM participants UNION SELECT DISTINCT author_key FROM turns "
                "WHERE author_key IS NOT NULL AND role = 'user'")]
            near = difflib.get_close_matches(target, known, n=3, cutoff=0.5)
            return f"no person {target!r}{where} in this familiar" + (
                f"; did you mean {', '.join(near)}?" if near else "; `familiar forget --list-people` names them")
        known = [r[0] for r in conn.execute(
            "SELECT platform_message_id FROM turns WHERE platform_message_id IS NOT NULL ORDER BY id DESC LIMIT 5000")]
        near = difflib.get_close_matches(target, known, n=3, cutoff=0.6)
        return f"no message {target!r}{where} in this familiar" + (f"; did you mean {', '.join(near)}?" if near else "")

    def erasures(self, *, pending_only: bool = False) -> list["Erasure"]:
        """The erasure log, oldest first (ids, counts and paths; no text is ever kept in it)."""
        rows = self._query(
            "SELECT id, requested_at, requested_by, kind, target, scope, status, done_at, check_words, check_files, "
            "check_left, checked_at FROM erasures" + (" WHERE status = 'pending'" if pending_only else "") + " ORDER BY id")
        turns: dict[int, list[int]] = {}
        replies: dict[tuple[int, str], list[int]] = {}
        if rows:
            ids = json.dumps([r[0] for r in rows])
            for erasure_id, turn_id in self._query(
                    "SELECT erasure_id, turn_id FROM erasure_turns WHERE erasure_id IN (SELECT value FROM json_each(?)) "
                    "ORDER BY turn_id", (ids,)):
                turns.setdefault(erasure_id, []).append(turn_id)
            for erasure_id, turn_id, action in self._query(
                    "SELECT erasure_id, turn_id, action FROM erasure_replies WHERE erasure_id IN "
                    "(SELECT value FROM json_each(?)) ORDER BY turn_id", (ids,)):
                replies.setdefault((erasure_id, action), []).append(turn_id)
        return [Erasure(r[0], datetime.fromisoformat(r[1]), r[2], r[3], r[4], r[5], tuple(turns.get(r[0], ())),
                        r[6], _parse_time(r[7]), tuple(replies.get((r[0], "erased"), ())),
                        tuple(replies.get((r[0], "redacted"), ())),
                        None if r[11] is None else ErasureCheck(r[8], r[9], tuple(json.loads(r[10] or "[]")),
                                                                datetime.fromisoformat(r[11])))
                for r in rows]

    def record_check(self, erasure_ids: Iterable[int], *, words: int, files: int, left: Iterable[str],
                     at: datetime | None = None) -> None:
        """Record what the scan after a purge found for these erasures (`Erasure.check`)."""
        ids = _check_ids(erasure_ids, "erasure id")
        stamp = _utc_text(at, "at")
        where = json.dumps(sorted(str(p) for p in left))
        with self._write() as conn:
            conn.executemany("UPDATE erasures SET check_words = ?, check_files = ?, check_left = ?, checked_at = ? "
                             "WHERE id = ?", [(words, files, where, stamp, i) for i in ids])

    def forgotten_people(self) -> list[tuple[str, str, int]]:
        """(canonical key, scope or "*" for everywhere, the last turn id when they were forgotten)."""
        return [(r[0], r[1], r[2]) for r in self._query(
            "SELECT canonical_key, scope, upto_turn_id FROM forgotten_people ORDER BY canonical_key, scope")]

    def unpurged_deleted(self, *, deleted_before: datetime | None = None) -> list[int]:
        """Ids of tombstoned turns whose text is still there: those of a pending erasure, and the
        others deleted before ``deleted_before`` (None: every one). The turn sensor asks every tick,
        so both halves are index lookups (the partial index of unpurged tombstones; the pending
        erasures' turns), never a scan of the log."""
        pending = ("SELECT t.turn_id FROM erasure_turns t JOIN erasures e ON e.id = t.erasure_id "
                   "JOIN turns ON turns.id = t.turn_id WHERE e.status = 'pending' AND turns.purged_at IS NULL "
                   "UNION SELECT r.turn_id FROM erasure_replies r JOIN erasures e ON e.id = r.erasure_id "
                   "JOIN turns ON turns.id = r.turn_id WHERE e.status = 'pending' AND r.action = 'erased' "
                   "AND turns.purged_at IS NULL")
        deleted = "SELECT id FROM turns WHERE deleted_at IS NOT NULL AND purged_at IS NULL"
        params: list[str] = []
        if deleted_before is not None:
            deleted += " AND deleted_at <= ?"
            params.append(_utc_text(deleted_before, "deleted_before"))
        return [r[0] for r in self._query(f"{pending} UNION {deleted} ORDER BY 1", params)]

    def said_after_forgotten(self, *, created_before: datetime | None = None) -> list[int]:
        """Ids of the turns forgotten people said after they were forgotten, and of the familiar's
        replies to them (text not purged yet), created before ``created_before`` (None: all). Index
        lookups only: the turn sensor asks every tick."""
        said = ("SELECT id FROM turns WHERE author_key IN (SELECT canonical_key FROM forgotten_people) "
                f"AND {_FORGOTTEN_AUTHOR.format(t='turns')}")
        sql = (f"SELECT id FROM turns WHERE purged_at IS NULL AND (id IN ({said}) OR reply_to_turn_id IN ({said}))")
        params: list[str] = []
        if created_before is not None:
            sql += " AND created_at <= ?"
            params.append(_utc_text(created_before, "created_before"))
        return [r[0] for r in self._query(sql + " ORDER BY id", params)]

    def answers_forgotten(self, turn_id: int) -> bool:
        """Whether a reply to ``turn_id`` answers a forgotten person's later message (what "opt_out" keeps
        out of memory: the reply is stored without their words, `familiar_bot.responder.flow`)."""
        _check_int(turn_id, "turn_id")
        return bool(self._query(f"SELECT 1 FROM turns WHERE id = ? AND {_FORGOTTEN_AUTHOR.format(t='turns')}",
                                (turn_id,)))

    # -- earlier texts of edited turns (docs/privacy.md: an edit forgets the old words)

    def prior_texts_due(self, *, edited_before: datetime | None = None, limit: int | None = None) -> list[TurnChange]:
        """The edits whose earlier text is still kept and is due to go: edited before ``edited_before``
        (None: every one), and every redaction of a pending erasure (its earlier text holds the erased
        words). Index lookups (the partial index of kept earlier texts; the pending erasures' replies):
        the turn sensor asks every tick."""
        before = "9999-12-31" if edited_before is None else _utc_text(edited_before, "edited_before")
        due = ("SELECT seq FROM turn_changes INDEXED BY turn_changes_prior WHERE prior_content IS NOT NULL AND at <= ? "
               "UNION SELECT c.seq FROM erasure_replies r JOIN erasures e ON e.id = r.erasure_id JOIN turn_changes c "
               "ON c.turn_id = r.turn_id WHERE e.status = 'pending' AND r.action = 'redacted' "
               "AND c.prior_content IS NOT NULL")
        rows = self._query(f"SELECT seq, turn_id, kind, revision, at, prior_content FROM turn_changes "
                           f"WHERE seq IN ({due}) ORDER BY seq LIMIT ?", [before, _sql_limit(limit)])
        return [TurnChange(seq=r[0], turn_id=r[1], kind=r[2], revision=r[3], at=datetime.fromisoformat(r[4]),
                           prior_content=r[5]) for r in rows]

    def purge_prior_texts(self, seqs: Iterable[int]) -> int:
        """Drop the earlier text these edits kept; how many. The bytes leave the file at the next `compact`."""
        ids = _check_ids(seqs, "change seq")
        dropped = 0
        with self._write() as conn:
            for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
                dropped += conn.execute(f"UPDATE turn_changes SET prior_content = NULL WHERE seq IN "
                                        f"({', '.join('?' * len(chunk))}) AND prior_content IS NOT NULL", chunk).rowcount
        return dropped

    def purge_text(self, turn_ids: Iterable[int], *, people: Iterable[str] = (), at: datetime | None = None) -> int:
        """Blank the text of these (tombstoned) turns: their content, the name they were said
        under, every earlier revision; drop the profile and nicknames of ``people`` (forgotten
        everywhere) and the mentions of them. Turns not deleted are tombstoned first. How many
        turns were purged. The bytes leave the file at the next `compact`.
        """
        ids = _check_ids(turn_ids, "turn id")
        keys = [_check_key(k, "person") for k in people]
        stamp = _utc_text(at, "at")
        purged = 0
        with self._write() as conn:
            for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
                marks = ", ".join("?" * len(chunk))
                conn.execute(f"UPDATE turns SET deleted_at = coalesce(deleted_at, ?) WHERE id IN ({marks})",
                             [stamp, *chunk])
                purged += conn.execute(
                    f"UPDATE turns SET content = '', author_display = NULL, purged_at = ? "
                    f"WHERE id IN ({marks}) AND purged_at IS NULL", [stamp, *chunk]).rowcount
                conn.execute(f"UPDATE turn_changes SET prior_content = NULL WHERE turn_id IN ({marks})", chunk)
            for key in keys:
                conn.execute("DELETE FROM participants WHERE canonical_key = ?", (key,))
                conn.execute("DELETE FROM guild_nicks WHERE canonical_key = ?", (key,))
                conn.execute("DELETE FROM turn_mentions WHERE canonical_key = ?", (key,))
        return purged

    def finish_erasures(self, erasure_ids: Iterable[int], *, at: datetime | None = None) -> None:
        """Mark these erasures done (their turns purged, every copy of their text gone)."""
        ids = _check_ids(erasure_ids, "erasure id")
        stamp = _utc_text(at, "at")
        with self._write() as conn:
            conn.executemany("UPDATE erasures SET status = 'done', done_at = ? WHERE id = ? AND status = 'pending'",
                             [(stamp, i) for i in ids])

    def compact(self) -> None:
        """Rewrite the file without free pages and empty the WAL, so no purged byte stays on disk
        (`storage.wipe`). A reader holding the WAL open makes the truncation wait or fail."""
        with self._lock:
            conn = self._live()
            if self.readonly or self._in_snapshot:
                raise TurnLogError(f"turn log {self.path} cannot be compacted from a read-only handle or a snapshot")
            try:
                emptied = vacuum(conn)
            except sqlite3.Error as exc:
                kind = TurnLogUnavailable if _unavailable(exc) else TurnLogError
                raise kind(f"compacting {self.path} failed: {storage_problem(self.path, exc)}") from exc
            if not emptied:
                raise TurnLogUnavailable(f"{self.path}: a reader kept the WAL busy; its old pages were not truncated")

    def texts_kept(self, keep: Mapping[str, tuple[str, list[str]]]) -> Iterator[str]:
        """Every text the log keeps (`PROSE_COLUMNS`) in the rows `keep` selects (`kept_prose`), a chunk at
        a time: what an erasure's words must be missing from to be its own."""
        for table, columns in PROSE_COLUMNS.items():
            where, params = keep.get(table, ("1", []))
            for column in columns:
                after = None
                while True:
                    rows = self._query(f"SELECT rowid, {column} FROM {table} WHERE {column} IS NOT NULL AND ({where}) "
                                       f"AND rowid > ? ORDER BY rowid LIMIT 5000", [*params, after or -2**63])
                    if not rows:
                        break
                    yield from (r[1] for r in rows)
                    after = rows[-1][0]

    def changes_after(self, seq: int, limit: int | None = None) -> list[TurnChange]:
        _check_int(seq, "seq")
        rows = self._query(
            "SELECT seq, turn_id, kind, revision, at, prior_content FROM turn_changes "
            "WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, _sql_limit(limit)),
        )
        return [
            TurnChange(
                seq=r[0], turn_id=r[1], kind=r[2], revision=r[3],
                at=datetime.fromisoformat(r[4]), prior_content=r[5],
            )
            for r in rows
        ]

    def log_id(self) -> str:
        """This log's random id (8 hex digits), or "" for a read-only log not yet migrated to have one."""
        try:
            row = self._query("SELECT value FROM log_meta WHERE key = 'log_id'")
        except TurnLogError:  # no log_meta table: a read-only view of an older log
            return ""
        return row[0][0] if row else ""

    def latest_change_seq(self) -> int:
        return self._query("SELECT coalesce(max(seq), 0) FROM turn_changes")[0][0]

    def first_changed_turn(self, after_seq: int) -> int | None:
        """The lowest turn id edited or deleted past change ``after_seq``; None when nothing changed since."""
        _check_int(after_seq, "seq")
        return self._query("SELECT min(turn_id) FROM turn_changes WHERE seq > ?", (after_seq,))[0][0]

    # -- participants

    def upsert_participant(
        self,
        canonical_key: str,
        *,
        username: str | None = None,
        global_name: str | None = None,
        pronouns: str | None = None,
        bio: str | None = None,
        seen_at: datetime | None = None,
    ) -> Participant:
        """Record what we know about an account; None never erases a known value.

        ``first_seen_at``/``last_seen_at`` widen to include ``seen_at``, so importing old
        history after live traffic does not move ``last_seen_at`` backwards.
        """
        _check_key(canonical_key)
        if is_ego_key(canonical_key):
            raise TurnLogError(f"{canonical_key!r} is the familiar itself, not a participant account")
        platform, _, user_id = canonical_key.partition(":")
        profile = {"username": username, "global_name": global_name, "pronouns": pronouns, "bio": bio}
        values = {name: _check_text(value, name) for name, value in profile.items()}
        at = _utc_text(seen_at, "seen_at")
        with self._write() as conn:
            row = conn.execute(
                "INSERT INTO participants (canonical_key, platform, user_id, username, global_name, "
                "pronouns, bio, first_seen_at, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (canonical_key) DO UPDATE SET "
                "username = coalesce(excluded.username, username), "
                "global_name = coalesce(excluded.global_name, global_name), "
                "pronouns = coalesce(excluded.pronouns, pronouns), "
                "bio = coalesce(excluded.bio, bio), "
                "first_seen_at = min(first_seen_at, excluded.first_seen_at), "
                "last_seen_at = max(last_seen_at, excluded.last_seen_at) "
                f"RETURNING {_PARTICIPANT_COLUMNS}",
                (canonical_key, platform, user_id, values["username"], values["global_name"],
                 values["pronouns"], values["bio"], at, at),
            ).fetchall()[0]
        return _participant_from_row(row)

    def participant(self, key: str) -> Participant | None:
        rows = self._query(f"SELECT {_PARTICIPANT_COLUMNS} FROM participants WHERE canonical_key = ?", (key,))
        return _participant_from_row(rows[0]) if rows else None

    def participants(self) -> list[Participant]:
        """Every known account, ordered by canonical key."""
        rows = self._query(f"SELECT {_PARTICIPANT_COLUMNS} FROM participants ORDER BY canonical_key")
        return [_participant_from_row(r) for r in rows]

    def upsert_guild_nick(
        self, canonical_key: str, guild_id: int, nick: str | None, seen_at: datetime | None = None
    ) -> None:
        """Record the account's nickname in a guild; None (or "") means it has none now."""
        _check_key(canonical_key)
        _check_int(guild_id, "guild_id")
        nick = _check_text(nick, "nick") or None
        at = _utc_text(seen_at, "seen_at")
        with self._write() as conn:
            conn.execute(
                "INSERT INTO guild_nicks (canonical_key, guild_id, nick, last_seen_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (canonical_key, guild_id) DO UPDATE SET "
                "nick = excluded.nick, last_seen_at = excluded.last_seen_at",
                (canonical_key, guild_id, nick, at),
            )

    def guild_nick(self, canonical_key: str, guild_id: int) -> str | None:
        rows = self._query(
            "SELECT nick FROM guild_nicks WHERE canonical_key = ? AND guild_id = ?", (canonical_key, guild_id)
        )
        return rows[0][0] if rows else None

    def resolve_label(
        self, key: str, guild_id: int | None = None, *, ego_label: str | None = None
    ) -> str:
        """The best current name for a key; never empty.

        Guild nick (only when ``guild_id`` is given) → global name → username → the
        display snapshot of the key's latest turn → the user-id part of the key. The ego
        key has no account: it reads ``ego_label`` (the familiar's display name) if given.
        """
        if not isinstance(key, str):
            raise TurnLogError(f"key must be a string, got {type(key).__name__}")
        if is_ego_key(key):
            return ego_label or key.partition(":")[2]
        if guild_id is not None:
            nick = self.guild_nick(key, guild_id)
            if nick:
                return nick
        known = self.participant(key)
        if known is not None and (known.global_name or known.username):
            return known.global_name or known.username  # type: ignore[return-value]
        latest = self._query(
            "SELECT author_display FROM turns WHERE author_key = ? AND author_display IS NOT NULL "
            "AND author_display != '' ORDER BY id DESC LIMIT 1",
            (key,),
        )
        if latest:
            return latest[0][0]
        platform, sep, user = key.partition(":")
        return (user if sep and user else key) or "?"

    def names_known(self, after_turn_id: int = 0, *, profiles: bool = True) -> tuple[int, list[tuple[str, str]]]:
        """``(latest turn id read, [(canonical key, name)])``: every name an account is known by.

        The profile names (global name, username) and every guild nickname (unless
        ``profiles`` is False), and each display name its turns were written under
        after ``after_turn_id`` (old names too: people are asked about by the name
        they had). Retrieval reads it to tell which participants a message names;
        a caller keeping the result passes the returned id back to read only the
        newer turns.
        """
        _check_int(after_turn_id, "after_turn_id")
        names: list[tuple[str, str]] = []
        if profiles:
            for key, username, global_name in self._query(
                    "SELECT canonical_key, username, global_name FROM participants"):
                names += [(key, n) for n in (global_name, username) if n]
            names += self._query("SELECT canonical_key, nick FROM guild_nicks WHERE nick IS NOT NULL AND nick != ''")
        latest = self._query("SELECT coalesce(max(id), 0) FROM turns")[0][0]
        names += self._query(
            "SELECT DISTINCT author_key, author_display FROM turns WHERE id > ? AND id <= ? "
            "AND author_key IS NOT NULL AND author_display IS NOT NULL AND author_display != ''",
            (after_turn_id, latest))
        return latest, names

    # -- mentions

    def record_mentions(self, turn_id: int, keys: Iterable[str]) -> None:
        """Link a turn to the participants it mentions (deduplicated; ego keys skipped)."""
        _check_int(turn_id, "turn_id")
        mentions = _mentionable(keys)
        if not mentions:
            return
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM turns WHERE id = ?", (turn_id,)).fetchone() is None:
                raise TurnLogError(f"cannot record mentions: turn {turn_id} does not exist")
            conn.executemany(
                "INSERT OR IGNORE INTO turn_mentions (turn_id, canonical_key) VALUES (?, ?)",
                [(turn_id, key) for key in mentions],
            )

    def mentions_for_turn(self, turn_id: int) -> list[str]:
        rows = self._query(
            "SELECT canonical_key FROM turn_mentions WHERE turn_id = ? ORDER BY canonical_key", (turn_id,)
        )
        return [r[0] for r in rows]

    def mentions_for_turns(self, ids: Iterable[int]) -> dict[int, list[str]]:
        """Mentions per requested turn id; ids without mentions map to []."""
        wanted = _check_ids(ids, "turn id")
        result: dict[int, list[str]] = {i: [] for i in wanted}
        if wanted:
            for turn_id, key in self._query(
                "SELECT turn_id, canonical_key FROM turn_mentions "
                "WHERE turn_id IN (SELECT value FROM json_each(?)) ORDER BY turn_id, canonical_key",
                (json.dumps(wanted),),
            ):
                result[turn_id].append(key)
        return result

    # -- reading turns

    def recent(
        self, channel_id: int, limit: int, *, before_id: int | None = None, include_deleted: bool = False
    ) -> list[Turn]:
        """The channel's last ``limit`` turns (below ``before_id`` if given), oldest first."""
        _check_int(channel_id, "channel_id")
        if _check_int(limit, "limit") <= 0:
            return []
        where, params = "channel_id = ?", [channel_id]
        if before_id is not None:
            where += " AND id < ?"
            params.append(_check_int(before_id, "before_id"))
        if not include_deleted:
            where += " AND deleted_at IS NULL"
        turns = self._turns(where, params + [limit], "ORDER BY id DESC LIMIT ?")
        turns.reverse()
        return turns

    def recent_cross_channel(self, limit: int, *, include_deleted: bool = False) -> list[Turn]:
        """The last ``limit`` turns over every channel, oldest first."""
        if _check_int(limit, "limit") <= 0:
            return []
        where = "1" if include_deleted else "deleted_at IS NULL"
        turns = self._turns(where, [limit], "ORDER BY id DESC LIMIT ?")
        turns.reverse()
        return turns

    def turns_after(
        self, after_id: int, limit: int | None = None, *, include_deleted: bool = True
    ) -> list[Turn]:
        """Turns with id > ``after_id``, ascending: the projections' incremental read.

        Tombstoned turns are included by default so that positions in the log (and so
        batch boundaries) do not shift when a message is deleted.
        """
        _check_int(after_id, "after_id")
        where = "id > ?" + ("" if include_deleted else " AND deleted_at IS NULL")
        return self._turns(where, [after_id, _sql_limit(limit)], "ORDER BY id LIMIT ?")

    def turns_in_range(self, after_id: int, upto_id: int, *, include_deleted: bool = True) -> list[Turn]:
        """Turns with ``after_id < id <= upto_id``, ascending (tombstones included by default)."""
        _check_int(after_id, "after_id")
        _check_int(upto_id, "upto_id")
        where = "id > ? AND id <= ?" + ("" if include_deleted else " AND deleted_at IS NULL")
        return self._turns(where, [after_id, upto_id])

    def turn_by_message(self, platform_message_id: str | int) -> Turn | None:
        """The turn of a platform message (the latest copy, should it have been logged twice), tombstone
        or not; None when the log never saw it. What an erasure of a message would reach (its author)."""
        message = _check_message_id(platform_message_id, "platform_message_id")
        rows = self._turns("platform_message_id = ?", [message], "ORDER BY id DESC LIMIT 1")
        return rows[0] if rows else None

    def turns_by_ids(self, ids: Iterable[int]) -> list[Turn]:
        """The turns that exist among ``ids`` (tombstones included), ascending by id."""
        wanted = _check_ids(ids, "turn id")
        if not wanted:
            return []
        return self._turns("id IN (SELECT value FROM json_each(?))", [json.dumps(wanted)])

    def live_channels(self, ids: Iterable[int]) -> dict[int, int]:
        """``{id: channel_id}`` of the live (not deleted) turns among ``ids``: the cheap read
        retrieval needs to find a turn's same-channel neighbours among many candidates."""
        wanted = _check_ids(ids, "turn id")
        if not wanted:
            return {}
        rows = self._query("SELECT id, channel_id FROM turns WHERE id IN (SELECT value FROM json_each(?)) "
                           "AND deleted_at IS NULL", [json.dumps(wanted)])
        return {int(i): int(c) for i, c in rows}

    def ids_in_scopes(self, scopes: Iterable[str], *, after_id: int, upto_id: int) -> list[int]:
        """Ids of the turns said in ``scopes`` (``scopes.turn_scope``) with ``after_id`` < id <=
        ``upto_id``, ascending, tombstones included: what a reply of those scopes may quote."""
        clause = turn_scope_sql(scopes)
        if clause is None:
            return []
        where, params = clause
        rows = self._query(f"SELECT id FROM turns WHERE id > ? AND id <= ? AND {where} ORDER BY id",
                           [int(after_id), int(upto_id), *params])
        return [r[0] for r in rows]

    def latest_id(self, channel_id: int | None = None) -> int:
        """The highest turn id (in the channel, if given), tombstones included; 0 when empty."""
        if channel_id is None:
            return self._query("SELECT coalesce(max(id), 0) FROM turns")[0][0]
        _check_int(channel_id, "channel_id")
        return self._query("SELECT coalesce(max(id), 0) FROM turns WHERE channel_id = ?", (channel_id,))[0][0]

    def count(self, *, include_deleted: bool = True) -> int:
        where = "" if include_deleted else " WHERE deleted_at IS NULL"
        return self._query(f"SELECT count(*) FROM turns{where}")[0][0]

    def recent_distinct_authors(self, channel_id: int, limit: int) -> list[str]:
        """Who spoke in the channel lately: distinct author keys, most recent first.

        Walks the channel tail newest-first in pages and stops once ``limit`` authors are
        found, so a busy channel costs a page or two rather than a scan of its history.
        Assistant turns and deleted turns do not count.
        """
        _check_int(channel_id, "channel_id")
        if _check_int(limit, "limit") <= 0:
            return []
        found: list[str] = []
        seen: set[str] = set()
        before = _SQLITE_INT_MAX
        while len(found) < limit:
            page = self._query(
                "SELECT id, author_key FROM turns WHERE channel_id = ? AND id < ? AND author_key IS NOT NULL "
                "AND role != 'assistant' AND deleted_at IS NULL ORDER BY id DESC LIMIT 256",
                (channel_id, before),
            )
            for _, key in page:
                if key not in seen:
                    seen.add(key)
                    found.append(key)
                    if len(found) == limit:
                        break
            if len(page) < 256:
                break
            before = page[-1][0]
        return found


def _sql_limit(limit: Any) -> int:
    """None means no limit (SQLite's LIMIT -1); a negative limit is a caller bug."""
    if limit is None:
        return -1
    if _check_int(limit, "limit") < 0:
        raise TurnLogError(f"limit must be >= 0 or None, got {limit}")
    return limit


def context_windows(channel_of: Mapping[int, int], targets: Iterable[int], span: int) -> dict[int, list[int]]:
    """``{target: ids of its window}``: the target and up to ``span`` ids of its channel on each side.

    ``channel_of`` maps the eligible turns (the caller decides which: live, not
    excluded) to their channel; a target missing from it has no window. The one
    definition of a context window: the `turn_window_embedding` projector embeds
    these at index time, `rag_context` blends over them when that projector is off.
    """
    by_channel: dict[int, list[int]] = {}
    for tid in sorted(channel_of):
        by_channel.setdefault(channel_of[tid], []).append(tid)
    out: dict[int, list[int]] = {}
    for tid in targets:
        if tid not in channel_of:
            continue
        same = by_channel[channel_of[tid]]
        at = bisect_left(same, tid)
        out[tid] = same[max(0, at - span):at] + [tid] + same[at + 1:at + 1 + span]
    return out
