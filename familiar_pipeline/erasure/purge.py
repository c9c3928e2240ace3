"""The last step of a familiar's run: purge what was erased, deleted or edited away from every file
the project writes, then look for it, before an erasure is called done.

An erasure (`familiar forget`, `/forget`) and a deleted message first go through memory as
any deletion does: the turn is tombstoned at once (with the familiar's replies to it; its later
replies that repeat the erased words are redacted as edits, `TurnLog.request_erasure`), and each
projection follows the change (facts resting on it removed, the summary folded again or redacted,
dossiers rebuilt, the full-text entry and the vectors dropped). An edit is followed the same way,
and its earlier text is due once `[memory.privacy] edited_retention_hours` has passed. Those steps
may need the words one last time (a redaction tells the model what to take out). Once every active
projection has followed, this step removes every remaining copy, in an order a killed run simply
repeats:

1. the rows *about* a forgotten person that rest on other people's turns (`spec.forget_person`);
2. rows that still rest on the turns, rows built through a row that is gone and was not rebuilt,
   and any row whose text still holds a word only the erased texts used (a redaction the model
   did not finish): deleted; their projector rebuilds what it can without them;
3. every full-text index rebuilt from its sources (`spec.search_rows`): a deleted document stays
   in a tantivy segment until a merge, a rebuild leaves no old segment;
4. two snapshots published, so the current and the previous (the reader's fallback) are clean
   and every older version's files are deleted; `memory.duckdb` rewritten into a new file (freed
   DuckDB pages keep their old bytes), and moved-aside corrupt copies deleted; the console's
   remembered name of a person forgotten everywhere deleted;
5. the LLM response cache: replies resting on the turns (their recorded provenance), made from an
   edited turn's earlier text, or holding an erased word;
6. Dagster's run and event storage and the log files under its home: erased words scrubbed
   (`words`), and read again;
7. the check (`verify`): every file of the familiar read for the erased words where its format
   keeps text; what it found is recorded in the erasure log, and if any file still holds one the
   run fails here (`ErasureIncomplete`), the text still in the turn log for the next run;
8. last, the turn log: the text blanked (content, name, earlier revisions, the due edits' earlier
   texts; a person forgotten everywhere loses their profile and nicknames), the file vacuumed and
   its WAL truncated; the erasures marked done.

Until step 8 the text is still in the turn log, so a run killed anywhere before it does the
whole purge again; after it, only step 8's bookkeeping is left, which is idempotent.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

import duckdb

from familiar_pipeline.erasure.due import changed_read, due_prior_texts, due_turns
from familiar_pipeline.erasure.verify import Leftovers, check_familiar
from familiar_pipeline.erasure.words import ScrubReport, Scrubber, distinctive_words, scrub_tree
from familiar_pipeline.models.llm import ResponseCache
from familiar_pipeline.storage import corrupt
from familiar_pipeline.storage.fts import analyze
from familiar_pipeline.storage.identity import CONSOLE_PLATFORM, console_slug
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import Table
from familiar_pipeline.storage.turns import Erasure, TurnLog, kept_prose
from familiar_pipeline.storage.words import SQL_WORD_TABLE, sql_rows_holding

if TYPE_CHECKING:
    from familiar_pipeline.engine.runtime import FamiliarRuntime
    from familiar_pipeline.engine.spec import ProjectorSpec

log = logging.getLogger(__name__)


class ErasureIncomplete(RuntimeError):
    """The check after a purge found an erased word still held: the erasures stay pending (with the
    text still in the turn log, so the next run can do the whole purge again) and the run fails."""


@dataclass
class Purge:
    """What one purge did: counts and ids, never text (it becomes run metadata)."""

    turns: int = 0
    erasures_done: list[int] = field(default_factory=list)
    words: int = 0  # distinctive words scrubbed from the files that cannot be rebuilt
    prior_texts: int = 0  # edits' earlier texts dropped from the turn log's change history
    rows_removed: dict[str, int] = field(default_factory=dict)
    about_people: int = 0  # rows about forgotten people resting on others' turns
    cache_replies: int = 0
    scrubbed: int = 0  # Dagster records and log lines rewritten
    scrub_failed: list[str] = field(default_factory=list)  # files that could not be scrubbed (named, not quoted)
    check: Leftovers | None = None  # the scan after the purge (`verify`)
    waiting: str | None = None  # why nothing was purged yet
    seconds: float = 0.0

    def metadata(self) -> dict:
        if self.waiting:
            return {"erasure": f"waiting: {self.waiting}"}
        return {"erasure": (f"{self.turns} turn(s) and {self.prior_texts} earlier text(s) purged, erasures done "
                            f"{self.erasures_done or '-'}, "
                            f"{sum(self.rows_removed.values()) + self.about_people} row(s) removed "
                            f"({self.about_people} about forgotten people), {self.cache_replies} cached repl(ies), "
                            f"{self.scrubbed} run record(s)/log line(s) scrubbed of {self.words} word(s), "
                            f"{self.seconds:.2f} s"),
                **({"erasure_check": self.check.summary()} if self.check is not None else {}),
                **({"erasure_scrub_failed": len(self.scrub_failed)} if self.scrub_failed else {})}


def purge(rt: FamiliarRuntime, specs: Sequence[ProjectorSpec], *, dagster_home: Path | None = None,
          now: datetime | None = None) -> Purge | None:
    """Purge the familiar's due turns and edits' earlier texts from every file (module doc); None when
    nothing is due. ErasureIncomplete when the check afterwards still finds an erased word.

    `specs`: every registered projector's (`engine.registry.specs()`, which the run loop hands in:
    this package sits below the engine and imports none of it). Runs with the familiar's writer lock
    held (the runtime's); it opens the turn log for writing.
    """
    started = time.perf_counter()
    cfg = rt.config
    with TurnLog(rt.paths.turns_db) as turn_log:
        pending = turn_log.erasures(pending_only=True)
        ids = due_turns(turn_log, cfg, now)
        edits = due_prior_texts(turn_log, cfg, now)
        if not ids and not pending and not edits:
            return None
        out = Purge()
        active = [s for s in specs if s.always_on or s.name in cfg.memory.projectors]
        everywhere = {e.target for e in pending if e.kind == "person" and e.scope is None}
        if cfg.memory.privacy.after_forget == "opt_out":  # a profile they showed again since is not kept either
            everywhere |= {key for key, scope, _ in turn_log.forgotten_people() if scope == "*"}
        scrubber = Scrubber(())
        # A person with no turn left to purge may still have facts about them (others' words).
        if ids or edits or any(e.kind == "person" for e in pending):
            with rt.store() as store:
                marks = store.serving_watermark()["projectors"]
            behind = list(changed_read(active, turn_log, marks, turn_log.latest_change_seq()))
            if behind:
                out.waiting = f"{', '.join(behind)} must follow the changes first"
                return out
            keeps = kept_prose(ids, [c.seq for c in edits], everywhere)
            erased = _texts(turn_log, ids) + [c.prior_content or "" for c in edits]
            scrubber = Scrubber(distinctive_words(erased, turn_log.texts_kept(keeps)))
            out.words = len(scrubber.words)
            rested_on = set(ids) | _remove_rows(rt, active, pending, ids, scrubber, out)
            tokens = {t for w in scrubber.words for t in analyze(w)}
            index_sources = _rebuild_search_indexes(rt, specs, tokens)
            with rt.store() as store:  # the current and the previous snapshot both clean; older versions deleted
                rt.publish(store, force=True)
                rt.publish(store, force=True)
            rt.release_store()
            rewrite_store(rt.paths.memory_db)
            for copy in corrupt.moved_aside(rt.paths):
                for path in (copy, copy.with_name(copy.name + ".wal")):
                    path.unlink(missing_ok=True)
            _forget_console_speaker(rt.paths, everywhere)
            out.cache_replies = forget_cached(rt.paths.llm_cache, rested_on, scrubber,
                                              edited={c.turn_id: c.at.timestamp() for c in edits})
            report = ScrubReport()
            if dagster_home is not None:
                report = scrub_tree(dagster_home, scrubber)
                out.scrubbed, out.scrub_failed = report.values, sorted(report.failed)
            out.check = check_familiar(rt.paths, scrubber.words, tables={t.name: t for s in specs for t in s.tables},
                                       index_sources=index_sources, turn_log_keeps=keeps)
            out.check.files += report.files  # the run history and logs, read again by the scrub itself
            for where in (*report.failed, *report.left):
                out.check.left[where] = report.left.get(where, 0) or 1
            turn_log.record_check([e.id for e in pending], words=out.check.words, files=out.check.files,
                                  left=out.check.left)
            if out.check.left:
                raise ErasureIncomplete(f"erasure check: {out.check.summary()}; the erasures stay pending and "
                                        "the next run purges again")
        out.turns = turn_log.purge_text(ids, people=sorted(everywhere))
        out.prior_texts = turn_log.purge_prior_texts([c.seq for c in edits])
        turn_log.compact()
        out.erasures_done = [e.id for e in pending]
        turn_log.finish_erasures(out.erasures_done)
    out.seconds = time.perf_counter() - started
    log.info("familiar %s: erasure purge: %s", rt.paths.familiar_id, out.metadata()["erasure"])
    return out


# --------------------------------------------------------------------------- steps


def _texts(turn_log: TurnLog, ids: list[int]) -> list[str]:
    """Every text of the turns: what they read now, the name said under, and every earlier revision."""
    wanted = set(ids)
    texts: list[str] = []
    for turn in turn_log.turns_by_ids(ids):
        texts += [turn.content, turn.author_display or ""]
    texts += [c.prior_content or "" for c in turn_log.changes_after(0) if c.turn_id in wanted]
    return texts


def _forget_console_speaker(paths: FamiliarPaths, everywhere: set[str]) -> None:
    """The console's remembered speaker name goes with a person forgotten everywhere."""
    name_file = paths.console_speaker
    if not everywhere or not name_file.exists():
        return
    try:
        said = name_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    if f"{CONSOLE_PLATFORM}:{console_slug(said)}" in everywhere:
        name_file.unlink(missing_ok=True)


def _remove_rows(rt: FamiliarRuntime, active: list, pending: list[Erasure], ids: list[int], scrubber: Scrubber,
                 out: Purge) -> set[int]:
    """Steps 1-2 (module doc), in one transaction; the turns the removed rows about people rested on."""
    rested_on: set[int] = set()
    with rt.store() as store:
        with store.transaction():
            people = [e for e in pending if e.kind == "person"]
            before = _row_counts(store) if people else {}
            for erasure in people:
                for spec in active:
                    forget = spec.load_forget_person()
                    if forget is not None:
                        rested_on |= forget(store, erasure.target, erasure.scope)
            if people:
                after = _row_counts(store)
                out.about_people = sum(before[t] - after[t] for t in before)
            _count(out.rows_removed, store.remove_resting_on(ids))
            for table in store.tables.values():
                if table.provenance.on_change == "own":  # built through rows that are gone, not rebuilt yet
                    _count(out.rows_removed, {table.name: delete_keys(store, table, store.stale_keys(table))})
                _count(out.rows_removed, {table.name: delete_holding(store, table, scrubber)})
            _count(out.rows_removed, store.remove_resting_on([]))
    return rested_on


def _row_counts(store: ProjectionStore) -> dict[str, int]:
    return {name: store.count(table) for name, table in store.tables.items()}


def _count(total: dict[str, int], more: dict[str, int]) -> None:
    for name, n in more.items():
        if n:
            total[name] = total.get(name, 0) + n


def delete_keys(store: ProjectionStore, table: Table, keys: list[tuple]) -> int:
    """Delete `table`'s rows with these keys; how many."""
    if not keys:
        return 0
    match = " AND ".join(f"t.{c} = k.c{i}" for i, c in enumerate(table.key))
    values = ", ".join("(" + ", ".join("?" * len(table.key)) + ")" for _ in keys)
    columns = ", ".join(f"c{i}" for i in range(len(table.key)))
    sql = (f"DELETE FROM {table.name} t USING (VALUES {values}) AS k({columns}) WHERE {match} "
           f"RETURNING {', '.join('t.' + c for c in table.key)}")
    return len(store.sql(sql, [v for key in keys for v in key]).fetchall())


def delete_holding(store: ProjectionStore, table: Table, scrubber: Scrubber) -> int:
    """Delete `table`'s rows whose prose (`col(prose=True)`) still holds one of the scrubber's words;
    how many. Only prose is searched: ids, keys and scopes are not words anyone said."""
    if not scrubber or not table.prose_columns:
        return 0
    # The prose cut into words as `words.Scrubber` cuts it (runs of 4+ letters or digits), joined with the words.
    store.sql(SQL_WORD_TABLE, [scrubber.words])
    return len(store.sql(f"DELETE FROM {table.name} WHERE rowid IN ({sql_rows_holding(table.name, table.prose_columns)}) "
                         "RETURNING 1").fetchall())


def _rebuild_search_indexes(rt: FamiliarRuntime, specs: Sequence[ProjectorSpec], tokens: set[str]) -> dict[str, set[str]]:
    """Rebuild every registered full-text index from its sources (a deleted document stays in a tantivy
    segment until a merge; an inactive projector's index still holds what it indexed); per index,
    which of `tokens` its sources still produce (for the check: a term that is not an erased copy)."""
    produced: dict[str, set[str]] = {}
    for spec in specs:
        search_rows = spec.load_search_rows()
        if spec.search_index is None or search_rows is None:
            continue
        with rt.store() as store:
            rows = search_rows(rt, store)
        seen: set[str] = set()
        produced[spec.search_index] = seen

        def watched(rows: Iterable[tuple[int, str]], seen: set[str] = seen) -> Iterator[tuple[int, str]]:
            for row in rows:
                if tokens:
                    seen.update(tokens.intersection(analyze(row[1])))
                yield row

        index = rt.search_index(spec.search_index)
        index.rebuild(watched(rows))
        index.collect_garbage()
    return produced


def rewrite_store(path: Path) -> None:
    """Copy the store into a new file and put it in place: DuckDB reuses freed pages without clearing
    them, so deleted rows' bytes stay in the old file until it is rewritten. No handle of this process
    may be open on it (the runtime released its store)."""
    if not path.exists():
        return
    fresh = path.with_name(path.name + ".rewrite")
    for stale in (fresh, fresh.with_name(fresh.name + ".wal")):
        stale.unlink(missing_ok=True)
    host = duckdb.connect(":memory:")
    try:
        quoted = str(path).replace("'", "''"), str(fresh).replace("'", "''")
        host.execute(f"ATTACH '{quoted[0]}' AS old_store")
        host.execute("CHECKPOINT old_store")  # its WAL folded in: nothing of it is left to replay later
        host.execute(f"ATTACH '{quoted[1]}' AS new_store")
        host.execute("COPY FROM DATABASE old_store TO new_store")
        host.execute("DETACH old_store")
        host.execute("DETACH new_store")
    except BaseException:
        host.close()
        fresh.unlink(missing_ok=True)
        raise
    host.close()
    os.chmod(fresh, path.stat().st_mode & 0o777)
    with open(fresh, "rb") as f:
        os.fsync(f.fileno())
    os.replace(fresh, path)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def forget_cached(cache_path: Path, turn_ids: Iterable[int], scrubber: Scrubber,
                  edited: Mapping[int, float] | None = None) -> int:
    """Drop the cached replies resting on these turns, made from an edited turn's earlier text
    (`edited`: turn id -> edit time), or holding an erased word; how many."""
    if not cache_path.exists():
        return 0
    cache = ResponseCache(cache_path)
    try:
        return cache.forget_resting_on(turn_ids, holding=scrubber.hits if scrubber else None, edited=edited)
    finally:
        cache.close()
