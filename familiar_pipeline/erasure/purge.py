"""The last step of a familiar's run: purge what was erased or deleted from every file the project writes.

An erasure (`familiar forget`, `/forget`) and a deleted message first go through memory as
any deletion does: the turn is tombstoned at once, and each projection follows the change
(facts resting on it removed, the summary folded again or redacted, dossiers rebuilt, the
full-text entry and the vectors dropped). Those steps may need the words one last time (a
redaction tells the model what to take out). Once every active projection has followed, this
step removes every remaining copy, in an order a killed run simply repeats:

1. the rows *about* a forgotten person that rest on other people's turns (`spec.forget_person`);
2. rows that still rest on the turns, rows built through a row that is gone and was not rebuilt,
   and any row whose text still holds a word only the erased turns used (a redaction the model
   did not finish): deleted; their projector rebuilds what it can without them;
3. the full-text indexes rebuilt from their sources (`spec.search_rows`): a deleted document
   stays in a tantivy segment until a merge, a rebuild leaves no old segment;
4. two snapshots published, so the current and the previous (the reader's fallback) are clean
   and every older version's files are deleted; `memory.duckdb` rewritten into a new file (freed
   DuckDB pages keep their old bytes), and moved-aside corrupt copies deleted;
5. the LLM response cache: replies resting on the turns (their recorded provenance), and any
   holding an erased word;
6. Dagster's run and event storage and the log files under its home: erased words scrubbed
   (`words`);
7. last, the turn log: the text blanked (content, name, earlier revisions; a person forgotten
   everywhere loses their profile and nicknames), the file vacuumed and its WAL truncated;
   the erasures marked done.

Until step 7 the text is still in the turn log, so a run killed anywhere before it does the
whole purge again; after it, only step 7's bookkeeping is left, which is idempotent.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import duckdb

from familiar_pipeline.erasure.due import due_turns
from familiar_pipeline.erasure.words import ScrubReport, Scrubber, distinctive_words, scrub_tree
from familiar_pipeline.models.llm import ResponseCache
from familiar_pipeline.projectors import registry
from familiar_pipeline.projectors.schedule import changed_read
from familiar_pipeline.storage import corrupt
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import Table
from familiar_pipeline.storage.turns import Erasure, TurnLog

if TYPE_CHECKING:
    from familiar_pipeline.projectors.runtime import FamiliarRuntime

log = logging.getLogger(__name__)


@dataclass
class Purge:
    """What one purge did: counts and ids, never text (it becomes run metadata)."""

    turns: int = 0
    erasures_done: list[int] = field(default_factory=list)
    words: int = 0  # distinctive words scrubbed from the files that cannot be rebuilt
    rows_removed: dict[str, int] = field(default_factory=dict)
    about_people: int = 0  # rows about forgotten people resting on others' turns
    cache_replies: int = 0
    scrubbed: int = 0  # Dagster records and log lines rewritten
    scrub_failed: list[str] = field(default_factory=list)  # files that could not be scrubbed (named, not quoted)
    waiting: str | None = None  # why nothing was purged yet
    seconds: float = 0.0

    def metadata(self) -> dict:
        if self.waiting:
            return {"erasure": f"waiting: {self.waiting}"}
        return {"erasure": (f"{self.turns} turn(s) purged, erasures done {self.erasures_done or '-'}, "
                            f"{sum(self.rows_removed.values()) + self.about_people} row(s) removed "
                            f"({self.about_people} about forgotten people), {self.cache_replies} cached repl(ies), "
                            f"{self.scrubbed} run record(s)/log line(s) scrubbed of {self.words} word(s), "
                            f"{self.seconds:.2f} s"),
                **({"erasure_scrub_failed": len(self.scrub_failed)} if self.scrub_failed else {})}


def purge(rt: FamiliarRuntime, *, dagster_home: Path | None = None, now: datetime | None = None) -> Purge | None:
    """Purge the familiar's due turns from every file (module doc); None when nothing is due.

    Runs with the familiar's writer lock held (the runtime's); it opens the turn log for writing.
    """
    started = time.perf_counter()
    cfg = rt.config
    with TurnLog(rt.paths.turns_db) as turn_log:
        pending = turn_log.erasures(pending_only=True)
        ids = due_turns(turn_log, cfg, now)
        if not ids and not pending:
            return None
        out = Purge()
        active = [s for s in registry.specs() if s.always_on or s.name in cfg.memory.projectors]
        # A person with no turn left to purge may still have facts about them (others' words).
        if ids or any(e.kind == "person" for e in pending):
            with rt.store() as store:
                marks = store.serving_watermark()["projectors"]
            behind = [n for n in changed_read(turn_log, marks, turn_log.latest_change_seq())
                      if n in {s.name for s in active}]
            if behind:
                out.waiting = f"{', '.join(behind)} must follow the deletions first"
                return out
            scrubber = Scrubber(distinctive_words(_texts(turn_log, ids), _surviving_texts(turn_log, set(ids))))
            out.words = len(scrubber.words)
            rested_on = set(ids) | _remove_rows(rt, active, pending, ids, scrubber, out)
            _rebuild_search_indexes(rt, active)
            with rt.store() as store:  # the current and the previous snapshot both clean; older versions deleted
                rt.publish(store, force=True)
                rt.publish(store, force=True)
            rt.release_store()
            rewrite_store(rt.paths.memory_db)
            for copy in corrupt.moved_aside(rt.paths):
                for path in (copy, copy.with_name(copy.name + ".wal")):
                    path.unlink(missing_ok=True)
            out.cache_replies = forget_cached(rt.paths.llm_cache, rested_on, scrubber)
            if dagster_home is not None:
                report: ScrubReport = scrub_tree(dagster_home, scrubber)
                out.scrubbed, out.scrub_failed = report.values, sorted(report.failed)
        everywhere = {e.target for e in pending if e.kind == "person" and e.scope is None}
        if cfg.memory.privacy.after_forget == "opt_out":  # a profile they showed again since is not kept either
            everywhere |= {key for key, scope, _ in turn_log.forgotten_people() if scope == "*"}
        out.turns = turn_log.purge_text(ids, people=sorted(everywhere))
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


def _surviving_texts(turn_log: TurnLog, erased: set[int]) -> Iterable[str]:
    after = 0
    while True:
        chunk = turn_log.turns_after(after, limit=5000, include_deleted=False)
        if not chunk:
            return
        for turn in chunk:
            if turn.id not in erased:
                yield turn.content
                yield turn.author_display or ""
        after = chunk[-1].id


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
                    if spec.forget_person is not None:
                        rested_on |= spec.forget_person(store, erasure.target, erasure.scope)
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
    # The prose cut into words as `words.Scrubber` cuts it (runs of 4+ letters or digits), looked up in the set.
    hit = " OR ".join(f"list_has_any(regexp_extract_all(lower(coalesce({c}, '')), '[\\pL\\pN]{{4,}}'), ?::VARCHAR[])"
                      for c in table.prose_columns)
    return len(store.sql(f"DELETE FROM {table.name} WHERE {hit} RETURNING 1",
                         [scrubber.words] * len(table.prose_columns)).fetchall())


def _rebuild_search_indexes(rt: FamiliarRuntime, active: list) -> None:
    for spec in active:
        if spec.search_index is None:
            continue
        with rt.store() as store:
            rows = spec.search_rows(rt, store)
        index = rt.search_index(spec.search_index)
        index.rebuild(rows)
        index.collect_garbage()


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


def forget_cached(cache_path: Path, turn_ids: Iterable[int], scrubber: Scrubber) -> int:
    """Drop the cached replies resting on these turns, or holding an erased word; how many."""
    if not cache_path.exists():
        return 0
    cache = ResponseCache(cache_path)
    try:
        return cache.forget_resting_on(turn_ids, holding=scrubber.hits if scrubber else None)
    finally:
        cache.close()
