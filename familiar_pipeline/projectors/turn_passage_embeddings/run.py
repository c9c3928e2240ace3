"""Passage vectors (projector `turn_passage_embedding`, opt-in): a vector per passage of each long live turn.

One vector per turn reads a long reply's opening only: MiniLM was trained on texts of up
to 256 word pieces, so the vector of a 3,000-character reply says little of what lies
deep in it (issue 48). A turn longer than ``LONG_FACTOR x passage_chars`` is cut where
the prompt cuts it (:func:`familiar_pipeline.storage.passages.long_turn_spans`) and each
passage is embedded as "speaker: passage"; `rag_context` raises a turn's cosine to its
best passage's (``[memory.retrieval].turn_passage_weight``) and shows that passage when
the cue's words pick none. Short turns get no row (their own vector reads them whole).

The run is the turn vectors' (:func:`run_turn_vectors`): the watermark is (last turn
id read, last change seq applied); new turns are read in chunks of ``batch_size`` and
their passages embedded ``batch_size`` at a time, written with the watermark in one
transaction; an edited turn loses every passage vector (all models: its old text must
not be found) and is cut and embedded again; a deleted turn loses them. A model swap
starts over (the old model's rows stay beside the new; reads use the active name).
Changing ``passage_chars`` changes every cut: rebuild (`backfill --rebuild`).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Sequence

from familiar_pipeline.projectors.turn_embeddings.run import TurnVectorPass, run_turn_vectors
from familiar_pipeline.projectors.turns_index.run import search_text
from familiar_pipeline.projectors.vectors import delete_vectors, embed_all, embedder_or_skip
from familiar_pipeline.storage import values
from familiar_pipeline.storage.passages import long_turn_spans
from familiar_pipeline.storage.scopes import turn_scope
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.times import now_or
from familiar_pipeline.storage.turns import Turn

from .spec import PROJECTOR
from .tables import TURN_PASSAGE_EMBEDDINGS

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime


def passage_texts(turn: Turn, size: int) -> list[str]:
    """What each passage vector of ``turn`` encodes ("speaker: passage", like the turn's own vector);
    ``[]`` for a turn too short to be cut (or deleted)."""
    if turn.deleted:
        return []
    text = turn.content or ""
    return [search_text(dataclasses.replace(turn, content=text[a:b].strip())) for a, b in long_turn_spans(text, size)]


def set_passage_vectors(store: ProjectionStore, model: str,
                        rows: Sequence[tuple[int, int, Sequence[float], str]], *, now: datetime | None = None) -> int:
    """Replace, under ``model``, the passage vectors of every turn in ``rows`` (``(turn id, passage,
    vector, scope)``) by these; returns the count. Every row is checked before anything is written."""
    checked = []
    for turn_id, passage, vector, scope in rows:
        tid = values.as_int(turn_id, "turn_id", minimum=1)
        floats = values.vector(model, "turn", tid, vector)
        checked.append((tid, values.as_int(passage, "passage", minimum=0), len(floats), floats, values.scope(scope)))
    if not checked:
        return 0
    at = now_or(now)
    name = TURN_PASSAGE_EMBEDDINGS.name
    with store.transaction():
        store.sql(f"DELETE FROM {name} WHERE model = ? AND turn_id IN (SELECT unnest(?))",
                  [model, sorted({r[0] for r in checked})])
        store.sql(f"INSERT INTO {name} (turn_id, passage, model, dim, vector, created_at, scope) "
                  "SELECT unnest(?::BIGINT[]), unnest(?::INTEGER[]), ?, unnest(?::INTEGER[]), unnest(?::FLOAT[][]), ?, "
                  "unnest(?::VARCHAR[])",
                  [[r[0] for r in checked], [r[1] for r in checked], model, [r[2] for r in checked],
                   [r[3] for r in checked], at, [r[4] for r in checked]])
    return len(checked)


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    embedder = embedder_or_skip(rt, report, PROJECTOR)
    if embedder is None:
        return
    knobs = rt.config.memory.turn_passage_embedding
    batch_size, size = knobs.batch_size, knobs.passage_chars
    turn_log = rt.turn_log()
    report.extra["removed"] = 0
    report.extra["long_turns"] = 0

    def write(turns: list[Turn], position: int, state: TurnVectorPass) -> bool:
        """Embed the passages of the long ones of ``turns`` (ids up to ``position``) and advance."""
        cut = [(t, p, text) for t in turns for p, text in enumerate(passage_texts(t, size))]
        vectors: list = []
        for start in range(0, len(cut), batch_size):
            got = embed_all(embedder, [text for _, _, text in cut[start:start + batch_size]], report)
            if got is None:
                return False
            vectors += list(got)
        with rt.store() as store:
            with store.transaction():
                set_passage_vectors(store, embedder.name,
                                    [(t.id, p, v, turn_scope(t)) for (t, p, _), v in zip(cut, vectors)])
                store.set_watermark(PROJECTOR, turn_id=position, change_seq=state.change_wm)
            rt.publish(store)
        if cut:
            report.batches += 1
            report.rows_written += len(cut)
            report.extra["long_turns"] += len({t.id for t, _, _ in cut})
        return True

    def on_chunk(chunk: list, state: TurnVectorPass) -> bool:
        return write([t for t in chunk if not t.deleted], chunk[-1].id, state)

    def on_changes(changed: list[int], state: TurnVectorPass) -> bool:
        """Edits and deletions of turns already read: every model's passage rows go, live ones are cut again."""
        current = {t.id: t for t in turn_log.turns_by_ids(changed)}
        with rt.store() as store:
            report.extra["removed"] += delete_vectors(store, TURN_PASSAGE_EMBEDDINGS, changed)
        edited = [current[tid] for tid in changed if tid in current and not current[tid].deleted]
        return all(write(edited[start:start + batch_size], state.turn_wm, state)
                   for start in range(0, len(edited), batch_size))

    run_turn_vectors(rt, report, embedder, projector=PROJECTOR, table=TURN_PASSAGE_EMBEDDINGS, batch_size=batch_size,
                     what="passage vector", on_chunk=on_chunk, on_changes=on_changes)
