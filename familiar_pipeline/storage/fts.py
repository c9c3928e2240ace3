"""Full-text indexes (tantivy) over turns and facts.

Each familiar has two independent indexes, ``fts/turns/`` and ``fts/facts/``. A
Dagster run is the only writer of each (tantivy's writer lock enforces one per
folder); the bot opens them read-only and calls :meth:`FtsIndex.reload` to see
new commits. The indexes are projections: the store is canonical, so a failed
commit is retried, then skipped, and :meth:`FtsIndex.rebuild` repairs anything.

Queries never go through tantivy's query parser: it raises on ordinary
punctuation (an apostrophe, a colon, an unbalanced quote) and would let
``field:value`` syntax through. Instead the user's text runs through the same
analyzer as the index and the surviving tokens become an OR of term queries, so
any text is a valid query and a long chatty cue still finds a turn that shares a
single word with it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self, cast

import tantivy
import tenacity
from tantivy import Filter, Occur, Query, TextAnalyzerBuilder, Tokenizer

log = logging.getLogger(__name__)

ANALYZER_NAME = "familiar_en"
ROW_ID = "row_id"
CONTENT = "content"

# Measured ad hoc on 2 cores with 100k chat-sized turns: two indexing threads
# were no faster than one (building documents in Python is the bottleneck), and
# each extra thread writes its own segments (more merging, more new files for
# an antivirus to trip on).
WRITER_HEAP_BYTES = 50_000_000
WRITER_THREADS = 1

COMMIT_RETRY_DELAYS_S = (0.05, 0.2, 0.5)

MAX_ROW_ID = 2**64 - 1

# Chat filler that would otherwise match half the log ("hey", "lol", "know")
# and drown the words that carry the cue. Changing the list changes which turns
# a cue retrieves, so retrieval figures measured before a change no longer hold.
STOPWORDS: frozenset[str] = frozenset(
    """
    a about an and any anything are as at be been but by can could did do does
    doing done for from had has have having he her here hey hi him his how i if
    in is it its just know lol me my no not of ok on or our out she so some than
    that the their them then there these they this those to too up very was we
    were what when where which who why will with would yes you your yours
    """.split()
)


class FtsError(RuntimeError):
    """A full-text index cannot do what was asked (the message says why)."""


class FtsLockedError(FtsError):
    """Another live writer holds the index; there is one writer per index."""


class FtsReadOnlyError(FtsError):
    """A write was attempted through an index opened for reading."""


def _build_analyzer() -> tantivy.TextAnalyzer:
    return (
        TextAnalyzerBuilder(Tokenizer.simple())
        # tantivy drops tokens of 64 *bytes* or more, measured before folding.
        .filter(Filter.remove_long(64))
        .filter(Filter.lowercase())
        .filter(Filter.ascii_fold())
        .filter(Filter.custom_stopword(sorted(STOPWORDS)))
        .filter(Filter.stemmer("english"))
        .build()
    )


_ANALYZER = _build_analyzer()


def _valid_utf8(text: str) -> str:
    """Replace lone surrogates, which cannot cross into Rust and would raise."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def analyze(text: str) -> list[str]:
    """The tokens the index stores for ``text``: the building blocks of a query.

    Lowercased, ASCII-folded, stopwords removed, English-stemmed; tokens of 64
    bytes or more are dropped. Any string is accepted (control characters,
    emoji, bidi marks and lone surrogates simply produce no tokens).
    """
    if not isinstance(text, str):
        raise TypeError(f"analyze() needs a str, got {type(text).__name__}")
    return _ANALYZER.analyze(_valid_utf8(text))


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_unsigned_field(ROW_ID, stored=True, indexed=True, fast=True)
    builder.add_text_field(CONTENT, stored=False, tokenizer_name=ANALYZER_NAME)
    return builder.build()


# --- commit retry policy ---------------------------------------------------

# What a momentarily locked file looks like in tantivy's error text: Rust's
# io::ErrorKind::PermissionDenied (e.g. a Windows antivirus scanner holding a
# freshly written segment file), Windows' "Access is denied" (os error
# 5), a sharing or lock violation (os error 32/33), or an EBUSY file. A writer
# whose worker thread died on such an error reports only that it "was killed";
# a rollback revives it, so that counts as transient too.
_TRANSIENT_MARKERS = re.compile(
    r"PermissionDenied|Permission denied|Access is denied|os error (?:5|32|33)\b"
    r"|being used by another process|ResourceBusy|Device or resource busy"
    r"|index writer was killed",
)


def is_transient_commit_error(exc: BaseException) -> bool:
    """True if retrying the same commit shortly may succeed."""
    return isinstance(exc, (ValueError, OSError)) and bool(_TRANSIENT_MARKERS.search(str(exc)))


def retry_transient(
    attempt: Callable[[], object],
    *,
    delays: Iterable[float] = COMMIT_RETRY_DELAYS_S,
    sleep: Callable[[float], None] = time.sleep,
    is_transient: Callable[[BaseException], bool] = is_transient_commit_error,
) -> bool:
    """Run ``attempt``; after a transient error sleep and try again.

    One attempt per delay plus a final one (4 with the default delays, about
    0.75 s of waiting at worst). Returns True on success and False once the
    retries are exhausted; a non-transient error is re-raised at once.
    """
    delays = list(delays)

    def log_retry(state: tenacity.RetryCallState) -> None:
        assert state.next_action is not None and state.outcome is not None  # set before a retry's sleep
        log.warning("[FTS] commit_retry=%d delay_s=%.2f err=%s", state.attempt_number,
                    state.next_action.sleep, state.outcome.exception())

    def give_up(state: tenacity.RetryCallState) -> bool:
        assert state.outcome is not None  # the last attempt's
        log.warning("[FTS] commit skipped after %d attempts err=%s", state.attempt_number, state.outcome.exception())
        return False

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_attempt(len(delays) + 1),
        wait=tenacity.wait_chain(*(tenacity.wait_fixed(d) for d in delays)) if delays else tenacity.wait_none(),
        sleep=sleep,
        before_sleep=log_retry,
        retry_error_callback=give_up,
    )

    def succeed() -> bool:
        attempt()
        return True

    return retrying(succeed)


# Tests replace this to run the retry policy without waiting.
_sleep = time.sleep


# --- the index -------------------------------------------------------------


def _check_row_id(row_id: object) -> int:
    if isinstance(row_id, bool) or not isinstance(row_id, int):
        raise TypeError(f"row_id must be an int, got {type(row_id).__name__} {row_id!r}")
    if not 0 <= row_id <= MAX_ROW_ID:
        raise ValueError(f"row_id must be between 0 and 2**64-1, got {row_id}")
    return row_id


def _check_row(row: Any) -> tuple[int, str]:
    try:
        row_id, text = row
    except (TypeError, ValueError):
        raise TypeError(f"rows must be (row_id, text) pairs, got {row!r:.80}") from None
    if not isinstance(text, str):
        raise TypeError(f"text of row {row_id!r} must be a str, got {type(text).__name__}")
    return _check_row_id(row_id), _valid_utf8(text)


def _ties_may_continue(hits: list, fetched: int, limit: int) -> bool:
    """Did the cut at ``fetched`` hits possibly split docs tied with the ``limit``-th?"""
    return len(hits) == fetched and hits[-1][0] >= hits[limit - 1][0]


class FtsIndex:
    """One tantivy index of ``(row_id, text)`` documents, keyed by ``row_id``.

    ``FtsIndex(path, writable=True)`` takes the folder's writer lock for its
    lifetime and fails at once with :class:`FtsLockedError` if another writer
    holds it. ``FtsIndex(path)`` opens a reader, which never needs the lock and
    sees a stable snapshot until :meth:`reload`. ``FtsIndex(None)`` is a private
    in-memory index, always writable since nobody else can write it.

    Writes are buffered until :meth:`commit`, and every buffered operation is
    also kept in a journal until a commit succeeds. That journal is what makes
    retries honest: after a failed commit tantivy's writer is broken (its later
    commits report success but contain nothing) until it is rolled back, and a
    rollback drops everything buffered. So any writer error marks the writer
    dirty, and the next commit attempt rolls back, replays the journal and
    commits. Replay is idempotent: an upsert deletes its id before adding, and
    a rebuild's plain adds always follow its own clear.
    """

    def __init__(self, path: Path | None, *, writable: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.writable = writable or path is None
        self._lock = threading.RLock()
        self._journal: list[tuple] = []
        self._dirty = False  # the writer's buffer can no longer be trusted
        self._schema = _schema()
        self._index: tantivy.Index | None = self._open_index()
        self._index.register_tokenizer(ANALYZER_NAME, _ANALYZER)
        # Readers move to a new commit only when asked, so one prompt assembly
        # never mixes two snapshots and no file-watcher thread runs per index.
        self._index.config_reader("manual")
        self._writer = self._open_writer() if self.writable else None

    def _open_index(self) -> tantivy.Index:
        if self.path is None:
            return tantivy.Index(self._schema)
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            return tantivy.Index(self._schema, path=str(self.path), reuse=True)
        except ValueError as exc:
            raise FtsError(
                f"cannot open the full-text index at {self.path}: {exc}. It is a "
                "projection: delete the folder and rebuild it from the store."
            ) from exc

    def _open_writer(self) -> tantivy.IndexWriter:
        try:
            return self._live_index().writer(heap_size=WRITER_HEAP_BYTES, num_threads=WRITER_THREADS)
        except ValueError as exc:
            if "LockBusy" in str(exc):
                raise FtsLockedError(
                    f"the full-text index at {self.path} is already open for writing "
                    "(by another process or another FtsIndex in this one); there is "
                    "one writer per index, so open this one read-only or wait for "
                    "the other writer to close"
                ) from exc
            raise

    # -- writing ------------------------------------------------------------

    def _require_writer(self) -> tantivy.IndexWriter:
        if self._index is None:
            raise FtsError("this FtsIndex is closed")
        if self._writer is None:
            raise FtsReadOnlyError(
                f"the full-text index at {self.path} was opened read-only; "
                "pass writable=True in the one process that writes it"
            )
        return self._writer

    def _id_query(self, row_id: int) -> tantivy.Query:
        return Query.term_query(self._schema, ROW_ID, row_id)

    def _apply(self, op: tuple) -> None:
        writer = self._writer
        assert writer is not None  # callers hold a writer (_require_writer)
        kind = op[0]
        if kind in ("upsert", "add"):
            _, row_id, text = op
            if kind == "upsert":
                writer.delete_documents_by_query(self._id_query(row_id))
            doc = tantivy.Document()
            doc.add_unsigned(ROW_ID, row_id)
            doc.add_text(CONTENT, text)
            writer.add_document(doc)
        elif kind == "delete":
            writer.delete_documents_by_query(self._id_query(op[1]))
        elif kind == "clear":
            writer.delete_all_documents()
        else:
            raise AssertionError(f"unknown journal op {kind!r}")

    def _record(self, op: tuple) -> None:
        if op[0] == "clear":
            self._journal.clear()  # nothing before a clear can matter any more
        self._journal.append(op)
        if self._dirty:
            return  # the next commit replays the journal into a rolled-back writer
        try:
            self._apply(op)
        except ValueError as exc:
            # A worker thread died (typically an IO error while opening a new
            # segment file); the op is journalled, so commit() can repair this.
            log.warning("[FTS] writer failed while buffering, will replay at commit err=%s", exc)
            self._dirty = True

    def upsert(self, row_id: int, text: str) -> None:
        """Index ``text`` under ``row_id``, replacing any earlier text for that id."""
        self.upsert_many([(row_id, text)])

    def upsert_many(self, rows: Iterable[tuple[int, str]]) -> int:
        """Upsert every ``(row_id, text)`` pair; returns how many were buffered.

        All rows are validated before any is buffered, so a bad row raises and
        leaves the index exactly as it was.
        """
        with self._lock:
            self._require_writer()
            checked = [_check_row(row) for row in rows]
            for row_id, text in checked:
                self._record(("upsert", row_id, text))
            return len(checked)

    def delete(self, row_id: int) -> None:
        """Remove the document for ``row_id`` (a no-op if there is none)."""
        self.delete_many([row_id])

    def delete_many(self, ids: Iterable[int]) -> int:
        """Remove the documents for ``ids``; returns how many deletions were buffered."""
        with self._lock:
            self._require_writer()
            checked = [_check_row_id(row_id) for row_id in ids]
            for row_id in checked:
                self._record(("delete", row_id))
            return len(checked)

    def clear(self) -> None:
        """Remove every document (takes effect at the next commit)."""
        with self._lock:
            self._require_writer()
            self._record(("clear",))

    def rebuild(self, rows: Iterable[tuple[int, str]]) -> int:
        """Replace the whole index with ``rows`` in one commit; returns the row count.

        Rows are validated first, so bad input raises before anything is
        cleared. A repeated id counts once, with its last text. If the commit is skipped the rows stay buffered for the next
        commit; the return value still counts them.
        """
        with self._lock:
            self._require_writer()
            # Last text wins for a repeated id, as with upserts; after a clear
            # there is nothing to delete, so plain adds skip a delete per row.
            latest = dict(_check_row(row) for row in rows)
            self._record(("clear",))
            for row_id, text in latest.items():
                self._record(("add", row_id, text))
            self.commit()
            return len(latest)

    def collect_garbage(self) -> None:
        """Delete the index's files no commit uses any more (after a `rebuild`: every old segment,
        with the terms of documents deleted before it). An erasure calls it so no purged word stays."""
        with self._lock:
            self._require_writer().garbage_collect_files()

    def _commit_once(self) -> None:
        """One commit attempt, first repairing the writer if an earlier error broke it."""
        try:
            writer = self._writer
            assert writer is not None  # commit() checked (_require_writer)
            if self._dirty:
                writer.rollback()
                for op in self._journal:
                    self._apply(op)
            writer.commit()
        except Exception:
            self._dirty = True
            raise
        self._dirty = False

    def commit(self) -> bool:
        """Make buffered writes durable and visible; False if the commit was skipped.

        Transient failures (a file locked for a moment) are retried after
        50/200/500 ms. If every attempt fails the writes stay buffered for the
        next commit, a warning is logged and False is returned: the caller
        records the skip, and since the store is canonical a rebuild repairs the
        index. Any other failure raises :class:`FtsError`; the writes stay
        buffered then too.
        """
        with self._lock:
            self._require_writer()
            if not self._journal:
                return True
            try:
                ok = retry_transient(self._commit_once, sleep=_sleep)
            except Exception as exc:
                raise FtsError(f"commit of the full-text index at {self.path} failed: {exc}") from exc
            if ok:
                self._journal.clear()
                self._live_index().reload()
            return ok

    # -- reading ------------------------------------------------------------

    def reload(self) -> None:
        """Move to the newest commit, including those made by another process."""
        self._live_index().reload()

    def doc_count(self) -> int:
        """Documents visible to searches (committed and loaded)."""
        return self._live_index().searcher().num_docs

    def doc_freq(self, term: str) -> int:
        """Documents holding an analyzed term (``analyze``'s output), deleted ones not yet merged away
        included: what an erasure's check asks of an index."""
        return int(self._live_index().searcher().doc_freq(CONTENT, term))

    def _live_index(self) -> tantivy.Index:
        if self._index is None:
            raise FtsError("this FtsIndex is closed")
        return self._index

    def _query(self, terms: list[str], max_id: int | None) -> tantivy.Query:
        text_query = Query.boolean_query(
            [(Occur.Should, Query.term_query(self._schema, CONTENT, term)) for term in terms]
        )
        if max_id is None:
            return text_query
        # A fast-field range filter scored 0, so it filters without shifting BM25.
        id_filter = Query.range_query(
            self._schema, ROW_ID, tantivy.FieldType.Unsigned, lower_bound=0, upper_bound=max_id
        )
        return Query.boolean_query(
            [(Occur.Must, text_query), (Occur.Must, Query.const_score_query(id_filter, 0.0))]
        )

    def search(self, query: str, limit: int, *, max_id: int | None = None) -> list[tuple[int, float]]:
        """The best ``limit`` ``(row_id, bm25)`` matches for ``query``, best first.

        A document matches if it shares any analyzed token with the query (OR).
        Equal scores are ordered by higher (newer) id. ``max_id`` keeps only
        ``row_id <= max_id``, applied inside the query so a filtered search
        still returns up to ``limit`` hits. Any text is a valid query; one with
        no searchable token (empty, stopwords, punctuation) returns [].
        """
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if max_id is not None and (isinstance(max_id, bool) or not isinstance(max_id, int)):
            raise TypeError(f"max_id must be an int or None, got {type(max_id).__name__}")
        index = self._live_index()
        terms = list(dict.fromkeys(analyze(query)))
        if limit <= 0 or not terms or (max_id is not None and max_id < 0):
            return []
        tantivy_query = self._query(terms, None if max_id is None else min(max_id, MAX_ROW_ID))
        searcher = index.searcher()
        total = searcher.num_docs
        if total == 0:
            return []
        # Fetch past the limit while the cut could split a run of tied scores,
        # so "higher id wins a tie" holds across the whole index. One hit beyond
        # the limit tells whether the cut splits a tie; fetching exactly `limit`
        # could not, so every search ran twice.
        fetch = min(limit + 1, total)
        hits = searcher.search(tantivy_query, fetch, count=False).hits
        while fetch < total and _ties_may_continue(hits, fetch, limit):
            fetch = min(fetch * 2, total)
            hits = searcher.search(tantivy_query, fetch, count=False).hits
        # ROW_ID is an unsigned fast field every document has; the stub's value type covers every field kind.
        ids = cast("list[int]", searcher.fast_field_values(ROW_ID, [address for _, address in hits]))
        ranked = sorted(zip(ids, (score for score, _ in hits)), key=lambda p: (-p[1], -p[0]))
        return [(int(row_id), float(score)) for row_id, score in ranked[:limit]]

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Commit anything still buffered, finish merges, release the writer lock.

        Safe to call twice. A failed final commit is logged, not raised, so
        ``close()`` in a ``finally`` never hides the original error.
        """
        with self._lock:
            if self._index is None:
                return
            if self._writer is not None:
                try:
                    if self._journal and not self.commit():
                        log.warning("[FTS] close: %d buffered ops not committed at %s", len(self._journal), self.path)
                except FtsError as exc:
                    log.warning("[FTS] close: final commit failed at %s: %s", self.path, exc)
                writer, self._writer = self._writer, None
                try:
                    writer.wait_merging_threads()  # consumes the writer, dropping its lock
                except ValueError as exc:
                    log.warning("[FTS] close: merge threads failed at %s: %s", self.path, exc)
            self._journal.clear()
            self._index = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "writer" if self._writer is not None else "reader"
        where = "in-memory" if self.path is None else str(self.path)
        return f"FtsIndex({where}, {mode})"
