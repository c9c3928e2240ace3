"""Turns by meaning: the cue's cosines to the snapshot's turn vectors, and to long turns' passage vectors.

When the opt-in ``turn_embedding`` projection is active with ``turn_embedding_weight > 0``,
the turns nearest to the cue join the candidates (one matrix product over the snapshot's
turn vectors). Every candidate gets its own cosine, BM25 hits included, blended with the
mean cosine of its context window (``turn_context``: the turn and its
``turn_context_span`` nearest same-channel turns each side; precombined into one matrix
per snapshot when ``turn_window_embedding`` is on). A long turn with passage vectors (the
opt-in ``turn_passage_embedding`` projection) has the larger of that cosine and
``turn_passage_weight`` x its best passage's: one vector per long reply reads only its
opening, its passages read the rest (one product over the passage matrix per reply,
aggregated per turn with ``np.maximum.at``). The nearest-turn search covers the newest
``turn_vector_search_rows`` vectors, and only rows of the reply's visible scopes (a row
mask per snapshot), so other scopes' turns never crowd a small scope out; the turns of a
time the cue names are searched too.

Apart from :mod:`turns` because this is the matrix side of the ranking: per-snapshot
matrices and masks, one product per reply, and no turn rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from familiar_pipeline.models.embedders import row_dots
from familiar_pipeline.projectors.turn_embeddings.tables import turn_matrix
from familiar_pipeline.projectors.turn_passage_embeddings.tables import passage_matrix
from familiar_pipeline.projectors.turn_windows.tables import context_turn_matrix
from familiar_pipeline.storage.passages import long_turn_spans

from familiar_bot.prompt.scoping import keep_ids


MAX_CONTEXT_CANDIDATES = 100  # candidates whose cosine is blended with their window (the nearest first)
MAX_WINDOW_ROWS = 20000  # turn vectors scored for a time window named in the cue (the newest of it)


def _dense_turns(cue: str, memory, limit: int, also: list[int],
                 windows: Callable[[list[int]], dict[int, list[int]]] | None = None,
                 cache: dict | None = None, id_ranges: Iterable[tuple[int, int]] = ()) -> dict[int, float]:
    """Cosines of the ``limit`` turns nearest to the cue and of the turns ``also`` (the BM25 hits),
    when turn vectors are on and present.

    With ``turn_context > 0`` each turn's cosine becomes ``(1 - share) x own +
    share x its context window's``: a reply is often about what the turns just
    before it said ("Which one?" after a question about dogs). When the
    ``turn_window_embedding`` projection is on, the window's cosine is that of
    its window vector, precombined with the turn's own into one matrix per
    snapshot (no extra work per reply). Otherwise, with ``windows`` (candidate
    id -> the ids of its context window, itself included), it is the mean of
    the window turns' own cosines, already in the matrix product; only the
    ``MAX_CONTEXT_CANDIDATES`` nearest candidates are blended, so a deep
    refetch does not look up thousands of windows. The nearest turns are
    searched among the newest ``turn_vector_search_rows`` vectors (see
    :class:`TurnScores`); ``also`` gets its cosines wherever it lies. Each of
    ``id_ranges`` (the turns of a time the cue names) adds its own ``limit``
    nearest. ``cache`` keeps the scores for the next refetch round of the same reply.
    """
    retrieval = memory.config.memory.retrieval
    embedder = memory.embedder
    if not dense_turns_on(memory):
        return {}
    cache = {} if cache is None else cache
    if "sims" not in cache:
        cache["sims"] = _turn_similarities(cue, memory, embedder, cache.get("visible"))
    if cache["sims"] is None:
        return {}
    scores: TurnScores = cache["sims"]
    out = scores.nearest(limit)
    for first, last in id_ranges:
        out.update(scores.nearest_in(first, last, limit))
    if also:
        out.update(scores.of(also))
    if scores.blended or windows is None or retrieval.turn_context <= 0 or not out:
        return out
    share = retrieval.turn_context
    window = windows(sorted(out, key=lambda t: -out[t])[:MAX_CONTEXT_CANDIDATES])
    around = scores.of({t for members in window.values() for t in members})
    for tid, own in out.items():
        near = [around[t] for t in window.get(tid, ()) if t in around]
        if near:
            out[tid] = (1 - share) * own + share * sum(near) / len(near)
    return out


def dense_turns_on(memory) -> bool:
    """Whether turns are ranked by cosine too (``turn_embedding`` on, a positive weight, an embedder)."""
    return (memory.config.memory.retrieval.turn_embedding_weight > 0 and memory.embedder is not None
            and memory.config.memory.is_active("turn_embedding"))


def top_rows(scores: np.ndarray, limit: int) -> np.ndarray:
    """Row numbers of the ``limit`` highest scores, in no particular order (argpartition, not a sort)."""
    if len(scores) <= limit:
        return np.arange(len(scores))
    return np.argpartition(-scores, limit - 1)[:limit]


@dataclass(frozen=True)
class TurnScores:
    """Cosines of one cue to the turn vectors (rows ascending by turn id).

    Only the newest ``len(ids) - start`` rows are scored at once (``sims``): a
    reply's nearest-turn search covers the newest ``turn_vector_search_rows``
    turns, so its cost stays flat as the log grows past that (a product over every
    vector was most of a reply's time on a large familiar: docs/benchmarks.md, "Latency
    of the turn ranking").
    Older turns still get their exact cosine when named (the BM25 hits): a few
    rows' product each time. ``blended`` says the rows already hold the window blend.
    """

    ids: np.ndarray
    matrix: np.ndarray
    cue: np.ndarray
    start: int
    sims: np.ndarray
    blended: bool
    # Rows the nearest-turn searches may return (turns of the reply's visible scopes); None: all.
    visible: np.ndarray | None = None
    # The turns' best passage cosines (passage vectors on and present), which raise their own.
    passages: "PassageScores | None" = None

    def _dots(self, rows: Any) -> np.ndarray:
        """Cosines of ``rows`` (row numbers) not in ``sims``, raised to their best passage's."""
        dots = row_dots(self.matrix[rows], self.cue)
        return dots if self.passages is None else np.maximum(dots, self.passages.floor_at(rows))

    def _rows_of(self, turn_ids: Iterable[int]) -> np.ndarray:
        want = np.fromiter(turn_ids, dtype=np.int64)
        if len(want) == 0 or len(self.ids) == 0:
            return np.zeros(0, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.ids, want), len(self.ids) - 1)
        return np.unique(at[self.ids[at] == want])

    def passage_of(self, turn_id: int) -> int | None:
        """The index of the passage of ``turn_id`` whose vector matched the cue best (None: none)."""
        if self.passages is None:
            return None
        rows = self._rows_of([turn_id])
        if len(rows) == 0:
            return None
        self.passages.floor_at(rows)
        best = int(self.passages.best[rows[0]])
        return best if best >= 0 else None

    def raised_by_passage(self, turn_ids: Iterable[int]) -> dict[int, int]:
        """``{turn id: passage}`` of the ``turn_ids`` whose cosine is their best passage's (above their own)."""
        if self.passages is None:
            return {}
        rows = self._rows_of(turn_ids)
        if len(rows) == 0:
            return {}
        floor = self.passages.floor_at(rows)
        raised = rows[floor > row_dots(self.matrix[rows], self.cue)]
        return {int(self.ids[r]): int(self.passages.best[r]) for r in raised}

    def passage_count(self) -> int:
        """How many turns have a passage vector in these scores."""
        return 0 if self.passages is None else self.passages.turns

    def _hide(self, sims: np.ndarray, low: int) -> np.ndarray:
        """``sims`` of rows ``low..`` with the rows of other scopes at -inf."""
        if self.visible is None:
            return sims
        return np.where(self.visible[low:low + len(sims)], sims, -np.inf)

    def nearest(self, limit: int) -> dict[int, float]:
        """``{turn id: cosine}`` of the ``limit`` best-scoring searched rows."""
        sims = self._hide(self.sims, self.start)
        return {int(self.ids[self.start + r]): float(sims[r]) for r in top_rows(sims, limit)
                if sims[r] > -np.inf}

    def nearest_in(self, first_id: int, last_id: int, limit: int) -> dict[int, float]:
        """``{turn id: cosine}`` of the ``limit`` best turns with ids in ``[first_id, last_id]``
        (a time window's turns: candidates the cue's words may not reach). At most the newest
        :data:`MAX_WINDOW_ROWS` of the range are scored."""
        low, high = (int(x) for x in np.searchsorted(self.ids, [first_id, last_id], side="left"))
        high = min(len(self.ids), high + int(high < len(self.ids) and self.ids[high] == last_id))
        low = max(low, high - MAX_WINDOW_ROWS)
        if high <= low:
            return {}
        split = max(low, min(high, self.start))
        parts = []
        if split > low:
            parts.append(self._dots(np.arange(low, split)))
        if high > split:
            parts.append(self.sims[split - self.start:high - self.start])
        sims = self._hide(np.concatenate(parts) if len(parts) > 1 else parts[0], low)
        return {int(self.ids[low + r]): float(sims[r]) for r in top_rows(sims, limit) if sims[r] > -np.inf}

    def of(self, wanted) -> dict[int, float]:
        """``{turn id: cosine}`` for the ``wanted`` ids that have a vector (a binary search)."""
        want = np.fromiter(wanted, dtype=np.int64)
        if len(want) == 0 or len(self.ids) == 0:
            return {}
        at = np.minimum(np.searchsorted(self.ids, want), len(self.ids) - 1)
        rows = np.unique(at[self.ids[at] == want])
        old, new = rows[rows < self.start], rows[rows >= self.start]
        out = {int(self.ids[r]): float(self.sims[r - self.start]) for r in new}
        if len(old):
            out.update(zip(self.ids[old].tolist(), self._dots(old).tolist()))
        return out


def _turn_similarities(cue: str, memory, embedder, visible: tuple[str, ...] | None = None) -> TurnScores | None:
    """The cue's :class:`TurnScores`, or None without usable vectors; with ``visible``, its
    nearest-turn searches rank only turns said in those scopes."""
    snapshot = memory.snapshot
    retrieval = memory.config.memory.retrieval
    found = None
    if retrieval.turn_context > 0 and memory.config.memory.is_active("turn_window_embedding"):
        found = context_turn_matrix(snapshot, embedder.name, retrieval.turn_context)
    blended = found is not None
    ids, matrix = found if found is not None else turn_matrix(snapshot, embedder.name)
    if len(ids) == 0:
        return None
    cue_vec = np.asarray(memory.cue_vector(cue), dtype=np.float32)
    if cue_vec.shape[0] != matrix.shape[1]:
        memory.warn_once("turn-dim", "turn vectors under %s have dim %d but the cue has %d; ignoring them",
                         embedder.name, matrix.shape[1], cue_vec.shape[0])
        return None
    cue_vec = cue_vec / (float(np.linalg.norm(cue_vec)) or 1.0)
    searched = retrieval.turn_vector_search_rows
    start = max(0, len(ids) - searched) if searched > 0 else 0
    mask = None
    if visible is not None:
        allowed = memory.scope_turn_ids(visible)
        mask = memory.memo(("turn-scope-mask", snapshot.version, embedder.name, blended, visible),
                           lambda: keep_ids(ids, allowed))
    sims = row_dots(matrix[start:], cue_vec)
    passages = _passage_scores(memory, snapshot, embedder.name, ids, cue_vec, blended, start)
    if passages is not None:
        sims = np.maximum(sims, passages.floor[start:])
    return TurnScores(ids, matrix, cue_vec, start, sims, blended, mask, passages)


class PassageScores:
    """One cue's cosines to the passage vectors, aggregated per turn row (the best passage's).

    ``floor[row]``: ``turn_passage_weight`` x the cosine of the turn's best passage (-inf: no
    passage vector); ``best[row]``: which passage (-1). Like :class:`TurnScores`, only the
    passages of the searched rows (``start`` on) are scored at once, one product and one
    ``np.maximum.at``; an older turn's passages are scored when it is asked for (a BM25 hit).
    """

    def __init__(self, rows: np.ndarray, matrix: np.ndarray, passages: np.ndarray, cue: np.ndarray,
                 weight: float, size: int, start: int) -> None:
        self.rows, self.matrix, self.passages, self.cue, self.weight = rows, matrix, passages, cue, weight
        self.floor = np.full(size, -np.inf, dtype=np.float32)
        self.best = np.full(size, -1, dtype=np.int64)
        self.done = np.zeros(size, dtype=bool)
        self.done[start:] = True
        self.turns = int(np.count_nonzero(np.diff(rows))) + 1 if len(rows) else 0
        self._score(np.arange(int(np.searchsorted(rows, start, side="left")), len(rows)))

    def _score(self, at: np.ndarray) -> None:
        """Score the passages at positions ``at`` into their turns' floor and best passage."""
        if len(at) == 0:
            return
        sims = row_dots(self.matrix[at], self.cue) * np.float32(self.weight)
        rows = self.rows[at]
        np.maximum.at(self.floor, rows, sims)
        top = sims >= self.floor[rows]  # each turn's best passage (a tie: one of them)
        self.best[rows[top]] = self.passages[at[top]]

    def floor_at(self, rows: np.ndarray) -> np.ndarray:
        """``floor`` of these turn rows, their passages scored first if they were not yet."""
        rows = np.asarray(rows, dtype=np.int64)
        todo = np.unique(rows[~self.done[rows]])
        if len(todo):
            low = np.searchsorted(self.rows, todo, side="left")
            counts = np.searchsorted(self.rows, todo, side="right") - low
            starts = np.repeat(low, counts)
            offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            self._score(starts + offsets)
            self.done[todo] = True
        return self.floor[rows]


def _passage_scores(memory, snapshot, model: str, ids: np.ndarray, cue_vec: np.ndarray, blended: bool,
                    start: int) -> PassageScores | None:
    """The cue's :class:`PassageScores` over the turn rows ``ids``, or None when passage vectors are
    off (``turn_passage_weight`` 0 or the ``turn_passage_embedding`` projection inactive) or absent.

    The passage matrix and each passage's turn row are built once per snapshot. A long reply's
    one vector reads its opening only (the embedder reads a bounded number of word pieces:
    docs/benchmarks.md, "Passage vectors"); its passages read the rest.
    """
    if not memory.config.memory.is_active("turn_passage_embedding"):
        return None
    weight = memory.config.memory.retrieval.turn_passage_weight
    if weight <= 0:
        return None
    found = passage_matrix(snapshot, model)
    if len(found.turn_ids) == 0 or found.matrix.shape[1] != cue_vec.shape[0]:
        return None

    def rows_of() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each passage's turn row, its passage matrix rows and passage numbers (passages whose turn
        has no turn vector yet left out), ascending by turn row."""
        at = np.minimum(np.searchsorted(ids, found.turn_ids), max(0, len(ids) - 1))
        keep = ids[at] == found.turn_ids
        if bool(keep.all()):  # the usual case: the served matrix itself, no copy
            return at, found.matrix, found.passages
        return at[keep], np.ascontiguousarray(found.matrix[keep]), found.passages[keep]

    rows, matrix, numbers = snapshot.current().cached(("passage_turn_rows", model, blended, len(ids)), rows_of)
    if len(rows) == 0:
        return None
    return PassageScores(rows, matrix, numbers, cue_vec, weight, len(ids), start)


def _matched_passage(scores: "TurnScores | None", memory) -> Callable[[Any], tuple[int, int] | None]:
    """For :func:`~familiar_bot.prompt.retrieval.passages.shown_part`: a turn's offsets of the passage whose
    vector matched the cue best (cut as the ``turn_passage_embedding`` projector cuts), or None."""
    if scores is None or scores.passages is None:
        return lambda turn: None
    chars = getattr(memory.config.memory.knobs("turn_passage_embedding"), "passage_chars",
                    memory.config.memory.retrieval.turn_passage_chars)

    def matched(turn: Any) -> tuple[int, int] | None:
        at = scores.passage_of(turn.id)
        spans = long_turn_spans(turn.content or "", chars) if at is not None else []
        return spans[at] if at is not None and at < len(spans) else None
    return matched
