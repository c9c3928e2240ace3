"""The one LLM client of the project: litellm behind per-slot config, retries, a
process-wide concurrency cap, token and cost accounting, and a response cache.

Why each piece exists:

* **Slots** (``[llm.reply]`` for the bot, ``[llm.background]`` for projectors) let
  an operator point chat and memory work at different models. A slot with no
  model fails with ``LlmNotConfigured`` naming the exact setting, before any call.
* **Retries** here (tenacity), not in litellm: we own the policy (which errors are
  transient, exponential backoff with jitter, ``max_retries`` from the slot) and can count
  retries in the materialization metadata. litellm's and the OpenAI SDK's own
  retries are switched off per call so the two never multiply.
* **Concurrency cap**: projectors for many familiars run in threads of one process;
  a shared ``BoundedSemaphore`` keeps them from flooding the provider. Async callers
  (the bot) get an ``asyncio.Semaphore`` per event loop with the same cap. The two
  are separate pools: a thread cannot wait on an asyncio semaphore.
* **Response cache**: docs/architecture.md §4 makes rebuilds free and reproducible by keying
  replies on the exact request. Empty replies are never cached, because callers
  treat "" as "try again later" and a cached "" would make that retry permanent.
  A cached reply may repeat what people said, so each one records the turns its request
  rests on (``llm_sources``), and ``ResponseCache.forget_resting_on`` erases exactly the
  replies a forgotten turn shaped, to the last byte of the file, and keeps the others.
* **Secrets**: the API key is read from ``os.environ[slot.api_key_env]`` at call
  time, never stored on the client, and scrubbed from every error message.

litellm is imported lazily (it takes seconds) and only after
``LITELLM_LOCAL_MODEL_COST_MAP=True`` is set, so importing it never touches the
network.

One module (~800 lines) because it is the one client: every call, whatever its slot,
goes through the same retries, cap, accounting and cache, and keeping them together is
what lets no caller bypass one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import os
import random
import re
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import tenacity

from familiar_pipeline.config import ConfigError, LlmConfig, LlmSlotConfig
from familiar_pipeline.models.litellm_import import import_litellm, when_imported
from familiar_pipeline.storage.wipe import vacuum

log = logging.getLogger(__name__)

# Parameters the client sets itself; passing them to complete() is a mistake.
_RESERVED_PARAMS = frozenset(
    {"model", "messages", "api_key", "api_base", "timeout", "stream", "num_retries", "max_retries"}
)

# Sent as the key to an OpenAI-compatible server at an api_base when no api_key_env is set.
LOCAL_SERVER_KEY = "no-key-local-server"

# HTTP statuses that mean "try again" when litellm raises a generic APIError.
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429})

# --- errors ------------------------------------------------------------------


class LlmNotConfigured(RuntimeError):
    """A slot cannot be called: no model, or its API key variable is unset."""


class LlmError(RuntimeError):
    """A call failed for good: a non-transient error, or retries ran out.

    The message is scrubbed of API keys. The original exception is deliberately
    not chained (its text may carry a key); its class name and HTTP status are
    kept as attributes for callers that want to tell failures apart.
    """

    def __init__(
        self,
        message: str,
        *,
        slot: str,
        model: str,
        attempts: int,
        kind: str,
        status_code: int | None,
        transient: bool,
    ) -> None:
        super().__init__(message)
        self.slot = slot
        self.model = model
        self.attempts = attempts
        self.kind = kind
        self.status_code = status_code
        self.transient = transient


# --- replies and usage -------------------------------------------------------


@dataclass(frozen=True)
class LlmReply:
    """One answer. ``text`` is "" when the model returned no content.

    On a cache hit ``cached`` is True, the token counts are those of the original
    call (so prompt sizes stay visible) and ``cost_usd`` is 0.0: nothing was spent.
    """

    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cached: bool
    latency_s: float


@dataclass
class LlmUsage:
    """Running totals for one run or one bot session (thread-safe).

    ``calls`` counts provider calls that returned a reply; tokens and cost sum
    over those only, so they show what was actually spent. ``cached_calls`` counts
    replies served from the cache, ``errors`` calls that ended in ``LlmError``,
    ``retries`` transient failures that were retried.
    """

    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    errors: int = 0
    retries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_reply(self, reply: LlmReply) -> None:
        with self._lock:
            if reply.cached:
                self.cached_calls += 1
                return
            self.calls += 1
            self.prompt_tokens += reply.prompt_tokens
            self.completion_tokens += reply.completion_tokens
            self.cost_usd += reply.cost_usd

    def record_error(self) -> None:
        with self._lock:
            self.errors += 1

    def record_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def as_metadata(self) -> dict[str, int | float]:
        """Plain values for Dagster materialization metadata."""
        with self._lock:
            return {
                "llm_calls": self.calls,
                "llm_cached_calls": self.cached_calls,
                "llm_prompt_tokens": self.prompt_tokens,
                "llm_completion_tokens": self.completion_tokens,
                "llm_cost_usd": round(self.cost_usd, 6),
                "llm_errors": self.errors,
                "llm_retries": self.retries,
            }


# --- response cache ------------------------------------------------------------


@dataclass(frozen=True)
class CachedReply:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


_CACHE_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS llm_response_cache (
        key TEXT PRIMARY KEY,
        model TEXT NOT NULL,
        text TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        cost_usd REAL NOT NULL,
        created_at REAL NOT NULL
    )
    """,
    # A reply's provenance (see `llm_sources`): the turns its request rests on, and `upto` when
    # it rests on every turn up to an id. A reply with neither has unknown provenance.
    "CREATE TABLE IF NOT EXISTS llm_cache_turns (key TEXT NOT NULL, turn_id INTEGER NOT NULL, "
    "PRIMARY KEY (key, turn_id)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS llm_cache_turns_by_turn ON llm_cache_turns (turn_id)",
    "CREATE TABLE IF NOT EXISTS llm_cache_upto (key TEXT PRIMARY KEY, upto INTEGER NOT NULL) WITHOUT ROWID",
)

# Where the cache keeps text a model wrote from what people said (the check after an erasure reads it).
CACHE_PROSE_COLUMNS: dict[str, tuple[str, ...]] = {"llm_response_cache": ("text",)}

# Bound parameters per statement, well under SQLite's limit.
_SQL_CHUNK = 500


@dataclass(frozen=True)
class LlmSources:
    """What a request rests on: turn ids of the turn log, directly or through derived rows its
    prompt quotes, and ``upto`` when it rests on every turn with an id <= upto (a compounding
    summary's previous text). A reply derived from a turn must go when that turn is forgotten.
    """

    turns: frozenset[int] = frozenset()
    upto: int | None = None

    def __bool__(self) -> bool:
        return bool(self.turns) or self.upto is not None

    def rests_on(self, turn_ids: frozenset[int]) -> bool:
        """True when forgetting ``turn_ids`` (non-empty) must take the reply with it."""
        return bool(self.turns & turn_ids) or (self.upto is not None and self.upto >= min(turn_ids))


_SOURCES: contextvars.ContextVar[LlmSources | None] = contextvars.ContextVar("llm_sources", default=None)


@contextlib.contextmanager
def llm_sources(turns: Iterable[int] = (), upto: int | None = None) -> Iterator[LlmSources]:
    """Declare what the model calls made inside rest on, so their cached replies can be forgotten.

    A context variable rather than a parameter: the calls go through wrappers and slots that
    need not know about it, and a declaration around an ``await`` holds for that task alone.
    Nested declarations add up (a call rests on everything every enclosing one names). A
    call made with nothing declared is cached with unknown provenance, which the first
    ``forget_resting_on`` erases.
    """
    outer = _SOURCES.get()
    turns = frozenset(int(t) for t in turns)
    if outer is not None:
        turns |= outer.turns
        if outer.upto is not None:
            upto = outer.upto if upto is None else max(upto, outer.upto)
    declared = LlmSources(turns, None if upto is None else int(upto))
    token = _SOURCES.set(declared)
    try:
        yield declared
    finally:
        _SOURCES.reset(token)


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT on an autocommit connection: a reply and its sources go together."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back already (a full disk)
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(items), _SQL_CHUNK):
        yield items[start:start + _SQL_CHUNK]


def _marks(items: list[Any]) -> str:
    return ",".join("?" * len(items))


class ResponseCache:
    """Replies keyed by the exact request: SQLite at ``path``, or a dict if None.

    The SQLite file is shared by the Dagster run processes of one host, so it uses
    WAL and a busy timeout, and the last write of a key wins (both writers computed
    a reply to the same request). A cache failure is logged and treated as a miss:
    the cache saves money, it must never fail a projection.

    Each reply is stored with its sources (``LlmSources``) in the same transaction, so
    ``forget_resting_on`` can erase what a forgotten turn shaped. ``secure_delete`` is on
    for every connection, so a deleted reply's bytes are overwritten, not left in free pages.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._memory: dict[str, CachedReply] = {}
        self._memory_sources: dict[str, LlmSources] = {}
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        if self.path is not None:
            self._conn = self._open()

    def __repr__(self) -> str:
        where = str(self.path) if self.path is not None else "memory"
        return f"ResponseCache({where!r}, hits={self.hits}, misses={self.misses})"

    @staticmethod
    def key(
        model: str,
        messages: list[dict[str, Any]],
        temperature: float | None,
        max_tokens: int | None,
        params: dict[str, Any] | None = None,
    ) -> str:
        """sha256 of the canonical JSON of everything that shapes the reply.

        Transport settings (timeout, api_base, key) are left out: they change how
        a request travels, not what the model is asked.
        """
        request = {
            "model": model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "params": params or {},
        }
        canonical = json.dumps(
            request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def get(self, key: str) -> CachedReply | None:
        found = self._get(key)
        with self._lock:
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
        return found

    def put(self, key: str, reply: CachedReply, sources: LlmSources | None = None) -> None:
        """Store ``reply`` with what its request rests on (None or empty: unknown provenance)."""
        if self.path is None:
            with self._lock:
                self._memory[key] = reply
                if sources:
                    self._memory_sources[key] = sources
                else:
                    self._memory_sources.pop(key, None)
            return
        try:
            with self._lock, _transaction(self._connection()) as conn:
                conn.execute(
                    "INSERT OR REPLACE INTO llm_response_cache VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        key,
                        reply.model,
                        reply.text,
                        reply.prompt_tokens,
                        reply.completion_tokens,
                        reply.cost_usd,
                        time.time(),
                    ),
                )
                conn.execute("DELETE FROM llm_cache_turns WHERE key = ?", (key,))
                conn.execute("DELETE FROM llm_cache_upto WHERE key = ?", (key,))
                if sources:
                    conn.executemany("INSERT INTO llm_cache_turns VALUES (?, ?)",
                                     [(key, turn) for turn in sorted(sources.turns)])
                    if sources.upto is not None:
                        conn.execute("INSERT INTO llm_cache_upto VALUES (?, ?)", (key, sources.upto))
        except sqlite3.Error as exc:
            log.warning("LLM response cache %s: write failed (%s); reply not cached", self.path, exc)

    def forget_resting_on(self, turn_ids: Iterable[int], *, holding: Callable[[str], bool] | None = None,
                          edited: Mapping[int, float] | None = None) -> int:
        """Delete every reply that rests on any of ``turn_ids``, and every reply of unknown
        provenance (written before sources were recorded, or by a call that declared none);
        how many replies were deleted. Replies resting only on other turns stay, so rebuilds
        that do not touch the forgotten turns stay free. ``holding(text)``: also delete the
        replies whose text it is true for (an erasure's words, wherever they came from).

        ``edited`` (turn id -> when it was edited, epoch seconds): also delete the replies resting
        directly on an edited turn that were cached before its edit (made from its earlier text).

        Then the file is scrubbed (checkpoint, VACUUM, checkpoint) so no deleted text is left
        in the database, its free pages or its WAL. Unlike reads and writes, a failure here is
        raised: a forget that did not happen must not pass for one. Forget the turns in the
        turn log first, or a run still reading them may cache a reply resting on them again.
        """
        wanted = frozenset(int(t) for t in turn_ids)
        edited = dict(edited or {})
        if not wanted and not edited:
            return 0
        if self.path is None:
            with self._lock:
                gone = [key for key in self._memory
                        if key not in self._memory_sources or self._memory_sources[key].rests_on(wanted | set(edited))
                        or (holding is not None and holding(self._memory[key].text))]
                for key in gone:
                    del self._memory[key]
                    self._memory_sources.pop(key, None)
            return len(gone)
        deleted = 0
        with self._lock:
            with _transaction(self._connection()) as conn:
                keys: set[str] = set()
                for chunk in _chunks(sorted(wanted)):
                    keys.update(row[0] for row in conn.execute(
                        f"SELECT key FROM llm_cache_turns WHERE turn_id IN ({_marks(chunk)})", chunk))
                if wanted:
                    keys.update(row[0] for row in conn.execute(
                        "SELECT key FROM llm_cache_upto WHERE upto >= ?", (min(wanted),)))
                for turn_id, at in edited.items():
                    keys.update(row[0] for row in conn.execute(
                        "SELECT t.key FROM llm_cache_turns t JOIN llm_response_cache c ON c.key = t.key "
                        "WHERE t.turn_id = ? AND c.created_at < ?", (int(turn_id), float(at))))
                keys.update(row[0] for row in conn.execute(
                    "SELECT key FROM llm_response_cache AS c"
                    " WHERE NOT EXISTS (SELECT 1 FROM llm_cache_turns AS t WHERE t.key = c.key)"
                    " AND NOT EXISTS (SELECT 1 FROM llm_cache_upto AS u WHERE u.key = c.key)"))
                if holding is not None:
                    keys.update(key for key, text in conn.execute("SELECT key, text FROM llm_response_cache")
                                if holding(text))
                for chunk in _chunks(sorted(keys)):
                    deleted += conn.execute(
                        f"DELETE FROM llm_response_cache WHERE key IN ({_marks(chunk)})", chunk).rowcount
                    conn.execute(f"DELETE FROM llm_cache_turns WHERE key IN ({_marks(chunk)})", chunk)
                    conn.execute(f"DELETE FROM llm_cache_upto WHERE key IN ({_marks(chunk)})", chunk)
            self._scrub(conn)
        return deleted

    def _scrub(self, conn: sqlite3.Connection) -> None:
        """Leave no deleted byte behind (`storage.wipe`)."""
        if not vacuum(conn):  # a checkpoint another connection kept from finishing
            raise sqlite3.OperationalError(
                f"LLM response cache {self.path}: the replies were deleted, but another process "
                "reading the cache kept the file from being scrubbed; run the forget again when it is done")

    def __len__(self) -> int:
        if self.path is None:
            return len(self._memory)
        with self._lock:
            return self._connection().execute("SELECT count(*) FROM llm_response_cache").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _get(self, key: str) -> CachedReply | None:
        if self.path is None:
            with self._lock:
                return self._memory.get(key)
        try:
            with self._lock:
                row = (
                    self._connection()
                    .execute(
                        "SELECT text, model, prompt_tokens, completion_tokens, cost_usd"
                        " FROM llm_response_cache WHERE key = ?",
                        (key,),
                    )
                    .fetchone()
                )
        except sqlite3.Error as exc:
            log.warning("LLM response cache %s: read failed (%s); treating as a miss", self.path, exc)
            return None
        return CachedReply(*row) if row else None

    def _connection(self) -> sqlite3.Connection:
        # A connection must not cross a fork; a child process opens its own.
        if self._conn is None or self._pid != os.getpid():
            self._conn = self._open()
            self._pid = os.getpid()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA secure_delete = ON")  # a forgotten reply is overwritten, not just unlinked
            for statement in _CACHE_SCHEMA:
                conn.execute(statement)
        except sqlite3.DatabaseError as exc:
            raise ValueError(
                f"LLM response cache {self.path} is not a usable SQLite database ({exc}); "
                "move it aside or delete it to start a fresh cache"
            ) from exc
        return conn


# --- concurrency cap -----------------------------------------------------------

_semaphores_lock = threading.Lock()
_sync_semaphores: dict[int, threading.BoundedSemaphore] = {}
_async_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _sync_semaphore(cap: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore for ``cap``: clients with the same cap share it."""
    with _semaphores_lock:
        semaphore = _sync_semaphores.get(cap)
        if semaphore is None:
            semaphore = _sync_semaphores[cap] = threading.BoundedSemaphore(cap)
        return semaphore


def _async_semaphore(cap: int) -> asyncio.Semaphore:
    """One asyncio semaphore per (event loop, cap): they cannot cross loops."""
    loop = asyncio.get_running_loop()
    with _semaphores_lock:
        per_loop = _async_semaphores.setdefault(loop, {})
        semaphore = per_loop.get(cap)
        if semaphore is None:
            semaphore = per_loop[cap] = asyncio.Semaphore(cap)
        return semaphore


def _reset_semaphores_after_fork() -> None:
    global _semaphores_lock
    _semaphores_lock = threading.Lock()
    _sync_semaphores.clear()
    _async_semaphores.clear()


os.register_at_fork(after_in_child=_reset_semaphores_after_fork)


# --- secrets -------------------------------------------------------------------

_SECRETISH_ENV = re.compile(r"(?i)(api_?key|token|secret|password)")
_SECRETISH_TEXT = re.compile(r"(?i)\b(sk-[A-Za-z0-9_\-]{8,}|bearer\s+[A-Za-z0-9._\-]{8,})")


def scrub_secrets(text: str, extra_secrets: tuple[str, ...] = ()) -> str:
    """Remove API keys from ``text``: given values, secret-looking env values, key shapes.

    litellm falls back to provider env vars (OPENAI_API_KEY, ...) when no key is
    passed, so every env var whose name looks secret is scrubbed too, not only the
    slot's own.
    """
    secrets = {s for s in extra_secrets if s and len(s) >= 4}
    secrets.update(
        value
        for name, value in os.environ.items()
        if _SECRETISH_ENV.search(name) and value and len(value) >= 8
    )
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return _SECRETISH_TEXT.sub("[redacted]", text)


# --- the client ----------------------------------------------------------------


class LlmClient:
    """Calls one slot's model. ``complete`` for threads, ``acomplete`` for asyncio.

    ``params`` given to a call (``temperature``, ``max_tokens``, ``response_format``,
    ...) override the slot's defaults and are part of the cache key. ``json_schema``
    (``{"name": ..., "schema": ...}``, kept beside each prompt's parser) becomes a
    ``response_format`` only when the slot's provider takes one (``structured``).
    """

    def __init__(
        self,
        slot: LlmSlotConfig,
        *,
        cache: ResponseCache | None = None,
        max_concurrency: int = 4,
        usage: LlmUsage | None = None,
        familiar_id: str | None = None,
        retry_base_delay_s: float = 1.0,
        retry_max_delay_s: float = 30.0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        if slot.max_retries < 0:
            raise ValueError(f"[llm.{slot.name}].max_retries must be 0 or more, not {slot.max_retries}")
        self.slot = slot
        self.cache = cache
        self.max_concurrency = max_concurrency
        self.usage = usage if usage is not None else LlmUsage()
        self.familiar_id = familiar_id
        self.retry_base_delay_s = retry_base_delay_s
        self.retry_max_delay_s = retry_max_delay_s
        self._structured: str | None = None

    def __repr__(self) -> str:
        return (
            f"LlmClient(slot={self.slot.name!r}, model={self.slot.model!r}, "
            f"api_base={self.slot.api_base!r}, api_key_env={self.slot.api_key_env!r}, "
            f"cache={'on' if self._caching else 'off'}, max_concurrency={self.max_concurrency})"
        )

    @property
    def configured(self) -> bool:
        return self.slot.configured

    @property
    def structured(self) -> str:
        """How calls that carry a ``json_schema`` send it as ``response_format`` (see ``schema_mode``)."""
        if self._structured is None:
            self._structured = schema_mode(self.slot)
        return self._structured

    @property
    def _caching(self) -> bool:
        return self.slot.cache and self.cache is not None

    def warm_up(self) -> None:
        """Import litellm in a background thread now, so the first reply does not wait for it."""
        if self.configured:
            threading.Thread(target=import_litellm, name="litellm-import", daemon=True).start()

    # -- sync ---------------------------------------------------------------

    def complete(self, messages: list[dict[str, Any]], **params: Any) -> LlmReply:
        """One reply; a caching slot stores it with the sources declared around the call (``llm_sources``)."""
        started = time.perf_counter()
        sources = _SOURCES.get()
        request, cache_key = self._prepare(messages, params)
        hit = self._cached(cache_key, started)
        if hit is not None:
            return hit
        return self._finish(self._call(request), cache_key, started, sources)

    def _call(self, request: dict[str, Any]) -> Any:
        """The provider's response, through the retries and the process-wide cap."""
        api_key = self._api_key()
        litellm = import_litellm()
        attempts = 0
        try:
            for attempt in self._retrying(tenacity.Retrying, time.sleep):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    with _sync_semaphore(self.max_concurrency):
                        response = litellm.completion(**request, api_key=api_key)
        except Exception as exc:  # noqa: BLE001 - classified in _failure, never swallowed
            raise self._failure(exc, attempts, api_key) from None
        return response

    # -- async --------------------------------------------------------------

    async def acomplete(self, messages: list[dict[str, Any]], **params: Any) -> LlmReply:
        """``complete`` on the event loop; the sources are those declared when it was called."""
        started = time.perf_counter()
        sources = _SOURCES.get()
        request, cache_key = self._prepare(messages, params)
        hit = await asyncio.to_thread(self._cached, cache_key, started)
        if hit is not None:
            return hit
        reply = self._reply(await self._acall(request), started)
        if cache_key is not None and reply.text:
            await asyncio.to_thread(self._store, cache_key, reply, sources)
        self.usage.record_reply(reply)
        return reply

    async def _acall(self, request: dict[str, Any]) -> Any:
        """`_call` on the event loop: the same retries, the async cap."""
        api_key = self._api_key()
        # Off the event loop: the first import takes seconds (longer on a busy host), and a
        # transport's loop must go on reading and recording messages meanwhile.
        litellm = await asyncio.to_thread(import_litellm)
        attempts = 0
        try:
            async for attempt in self._retrying(tenacity.AsyncRetrying, asyncio.sleep):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    async with _async_semaphore(self.max_concurrency):
                        response = await litellm.acompletion(**request, api_key=api_key)
        except Exception as exc:  # noqa: BLE001 - classified in _failure, never swallowed
            raise self._failure(exc, attempts, api_key) from None
        return response

    def _cached(self, cache_key: str | None, started: float) -> LlmReply | None:
        """The cached reply to this request, if the slot caches and has one."""
        if cache_key is None or self.cache is None:
            return None
        hit = self.cache.get(cache_key)
        return None if hit is None else self._from_cache(hit, started)

    # -- shared steps -------------------------------------------------------

    def _prepare(
        self, messages: list[dict[str, Any]], params: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        """Validate the call and build the litellm request (without the key)."""
        if not self.slot.configured:
            raise LlmNotConfigured(self._not_configured_message())
        reserved = sorted(_RESERVED_PARAMS.intersection(params))
        if reserved:
            raise TypeError(
                f"{', '.join(reserved)} cannot be passed per call; they come from [llm.{self.slot.name}]"
            )
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ValueError(f"messages[{index}] must be a dict with a 'role', got {message!r:.80}")
        extra = dict(params)
        schema = extra.pop("json_schema", None)
        mode = self.structured if schema is not None else "off"
        if mode == "json_schema":
            extra.setdefault("response_format", {"type": "json_schema", "json_schema": schema})
        elif mode == "json_object":
            extra.setdefault("response_format", {"type": "json_object", "schema": schema["schema"]})
        temperature = extra.pop("temperature", self.slot.temperature)
        max_tokens = extra.pop("max_tokens", self.slot.max_tokens)
        request = {
            "model": self.slot.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "timeout": self.slot.timeout_s,
            "api_base": self.slot.api_base,
            # Our retry loop is the only one: litellm's and the SDK's are off.
            "num_retries": 0,
            "max_retries": 0,
            # A provider that rejects e.g. temperature should still answer.
            "drop_params": True,
            **extra,
        }
        cache_key = None
        if self._caching:
            cache_key = ResponseCache.key(self.slot.model, messages, temperature, max_tokens, extra)
        return request, cache_key

    def _api_key(self) -> str | None:
        name = self.slot.api_key_env
        if not name:
            # A local OpenAI-compatible server (llama.cpp, vLLM) needs no key, but the
            # OpenAI SDK refuses to send a request without one and would otherwise pick up
            # OPENAI_API_KEY, sending a real key to whatever api_base points at.
            if self.slot.api_base and self.slot.model.startswith("openai/"):
                return LOCAL_SERVER_KEY
            return None
        value = os.environ.get(name)
        if not value:
            raise LlmNotConfigured(
                f"LLM slot {self.slot.name!r} reads its API key from the environment variable "
                f"{name}, which is not set: export {name}=... before starting, or change "
                f"[llm.{self.slot.name}].api_key_env in {self._character_toml()}"
            )
        return value

    def _not_configured_message(self) -> str:
        name = self.slot.name
        return (
            f"LLM slot {name!r} has no model: set [llm.{name}].model in {self._character_toml()} "
            f"or FAMILIAR__LLM__{name.upper()}__MODEL (a litellm model string such as "
            "'openrouter/z-ai/glm-4.6')"
        )

    def _character_toml(self) -> str:
        return f"data/familiars/{self.familiar_id or '<id>'}/character.toml"

    def _retrying(self, retrying: type, sleep: Any) -> Any:
        """The retry policy, for ``tenacity.Retrying`` (sync) or ``AsyncRetrying``:
        transient errors only, ``max_retries`` retries after the first attempt,
        jittered exponential backoff; the last error is re-raised as it was."""
        return retrying(
            retry=tenacity.retry_if_exception(_is_transient),
            stop=tenacity.stop_after_attempt(self.slot.max_retries + 1),
            wait=self._backoff,
            sleep=sleep,
            before_sleep=self._count_retry,
            reraise=True,
        )

    def _backoff(self, state: tenacity.RetryCallState) -> float:
        """Half the exponential ceiling plus up to half again at random, so clients that
        failed together do not retry together."""
        ceiling = min(self.retry_max_delay_s, self.retry_base_delay_s * 2 ** (state.attempt_number - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def _count_retry(self, state: tenacity.RetryCallState) -> None:
        """Runs only when a retry will happen: count it and say why."""
        assert state.outcome is not None  # the failed attempt's
        self.usage.record_retry()
        log.warning(
            "LLM slot %s: %s on attempt %d/%d; retrying in %.2fs",
            self.slot.name,
            type(state.outcome.exception()).__name__,
            state.attempt_number,
            self.slot.max_retries + 1,
            state.upcoming_sleep,
        )

    def _failure(self, exc: Exception, attempts: int, api_key: str | None) -> LlmError:
        self.usage.record_error()
        transient = _is_transient(exc)
        detail = str(exc).split("\nTraceback", 1)[0].strip()
        detail = scrub_secrets(detail, (api_key,) if api_key else ())
        if len(detail) > 600:
            detail = detail[:600] + "..."
        why = "retries exhausted" if transient else "not retryable"
        status = getattr(exc, "status_code", None)
        return LlmError(
            f"LLM slot {self.slot.name!r} (model {self.slot.model}) failed after {attempts} "
            f"attempt(s), {why}: {type(exc).__name__}"
            + (f" [HTTP {status}]" if isinstance(status, int) else "")
            + f": {detail}",
            slot=self.slot.name,
            model=self.slot.model,
            attempts=attempts,
            kind=type(exc).__name__,
            status_code=status if isinstance(status, int) else None,
            transient=transient,
        )

    def _from_cache(self, hit: CachedReply, started: float) -> LlmReply:
        reply = LlmReply(
            text=hit.text,
            model=hit.model,
            prompt_tokens=hit.prompt_tokens,
            completion_tokens=hit.completion_tokens,
            cost_usd=0.0,
            cached=True,
            latency_s=time.perf_counter() - started,
        )
        self.usage.record_reply(reply)
        return reply

    def _finish(self, response: Any, cache_key: str | None, started: float,
                sources: LlmSources | None) -> LlmReply:
        reply = self._reply(response, started)
        if cache_key is not None and reply.text:
            self._store(cache_key, reply, sources)
        self.usage.record_reply(reply)
        return reply

    def _store(self, cache_key: str, reply: LlmReply, sources: LlmSources | None) -> None:
        self.cache.put(  # type: ignore[union-attr]
            cache_key,
            CachedReply(
                text=reply.text,
                model=reply.model,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                cost_usd=reply.cost_usd,
            ),
            sources,
        )

    def _reply(self, response: Any, started: float) -> LlmReply:
        usage = getattr(response, "usage", None)
        return LlmReply(
            text=_content_text(response),
            model=getattr(response, "model", None) or self.slot.model,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            cost_usd=self._cost(response),
            cached=False,
            latency_s=time.perf_counter() - started,
        )

    def _cost(self, response: Any) -> float:
        """litellm's price for the call, or 0.0 when the model has no known pricing.

        litellm prices every response it returns and stamps the result in its hidden
        params (None when it knows no price for the model). Asking `completion_cost`
        again would search its cost map a second time for the same answer (~1.7 ms
        a call for an unpriced model), so only a response without the stamp is priced here.
        """
        hidden = getattr(response, "_hidden_params", None) or {}
        stamped = isinstance(hidden, dict) and "response_cost" in hidden
        cost = hidden.get("response_cost") if stamped else None
        if not stamped:
            try:
                cost = import_litellm().completion_cost(completion_response=response, model=self.slot.model)
            except Exception:  # noqa: BLE001 - unknown pricing is normal (local models, fakes)
                cost = 0.0
        try:
            return max(0.0, float(cost or 0.0))
        except (TypeError, ValueError):
            return 0.0


def _content_text(response: Any) -> str:
    """The first choice's text; "" for no choices or None content."""
    choices = getattr(response, "choices", None) or []
    if not choices:
        return ""
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    return content if isinstance(content, str) else ""


def _is_transient(exc: BaseException) -> bool:
    """Rate limits, timeouts, connection drops and 5xx are worth another try."""
    litellm = import_litellm()
    transient_types = (
        litellm.RateLimitError,
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
    )
    if isinstance(exc, transient_types):
        return True
    if isinstance(exc, litellm.APIError):
        status = getattr(exc, "status_code", None)
        return isinstance(status, int) and (status in _TRANSIENT_STATUS or status >= 500)
    return False


# Providers that take a JSON schema as response_format (litellm maps it to Ollama's
# `format` and vLLM's guided decoding).
_SCHEMA_PROVIDERS = frozenset({"ollama", "ollama_chat", "hosted_vllm", "lm_studio"})


def schema_mode(slot: LlmSlotConfig) -> str:
    """``[llm.<slot>].structured`` resolved: "json_schema", "json_object" or "off".

    "auto": off for fakes; "json_object" for an OpenAI-compatible server at an
    api_base (``openai/<name>``): llama.cpp's servers (llama-cpp-python's accepts
    no other type) constrain decoding to the schema given with it, and other
    servers at least switch to JSON mode; "json_schema" for Ollama, vLLM, LM
    Studio and hosted models litellm lists as schema-capable. The parsers stay
    tolerant, so a provider that ignores the schema loses nothing.
    """
    if slot.structured != "auto":
        return slot.structured
    provider = slot.model.split("/", 1)[0] if "/" in slot.model else ""
    if provider == "fake" or not slot.configured:
        return "off"
    if provider == "openai" and slot.api_base:
        return "json_object"
    if provider in _SCHEMA_PROVIDERS:
        return "json_schema"
    try:
        return "json_schema" if import_litellm().supports_response_schema(model=slot.model) else "off"
    except Exception:  # noqa: BLE001 - an unknown model is simply not known to support it
        return "off"


def client_for(
    config: LlmConfig,
    slot_name: str,
    *,
    cache_path: str | os.PathLike[str] | None = None,
    usage: LlmUsage | None = None,
    familiar_id: str | None = None,
) -> LlmClient:
    """The client for one slot of a familiar's config.

    A slot missing from the config gives an unconfigured client, whose first call
    raises ``LlmNotConfigured`` naming the setting. A caching slot uses the SQLite
    cache at ``cache_path``, or an in-memory one when no path is given. A model whose
    provider is installed by a ``familiar.llm_providers`` entry point (the scripted
    ``fake/`` models: scripted from ``FAMILIAR_FAKE_LLM`` when set) gets it installed,
    so a Dagster run subprocess can use it through config alone.
    """
    if not isinstance(slot_name, str) or not slot_name:
        raise ConfigError(f"LLM slot name must be a non-empty string, not {slot_name!r}")
    slot = config.slots.get(slot_name) or LlmSlotConfig(name=slot_name)
    installer = provider_installer(slot.model)
    if installer is not None:
        when_imported(installer)  # with litellm, when a call is due: a run with none never imports it
    cache = ResponseCache(cache_path) if slot.cache else None
    return LlmClient(
        slot,
        cache=cache,
        max_concurrency=config.max_concurrency,
        usage=usage,
        familiar_id=familiar_id,
    )


PROVIDER_ENTRY_POINTS = "familiar.llm_providers"


@functools.lru_cache(maxsize=64)
def provider_installer(model: str) -> Callable[[], Any] | None:
    """The installer of the litellm provider a model string names (``fake/careful``: ``fake``), when an
    installed package declares one under the ``familiar.llm_providers`` entry points; else None
    (litellm's own providers need none). How providers this package does not ship (the scripted
    offline models of ``familiar_pipeline.testing``) are plugged in without the client importing them.
    """
    prefix = model.split("/", 1)[0] if "/" in model else ""
    if not prefix:
        return None
    found = entry_points(group=PROVIDER_ENTRY_POINTS, name=prefix)
    return next(iter(found)).load() if found else None
