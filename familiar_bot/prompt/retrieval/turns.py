"""Earlier turns for ``rag_context``: candidates, their fusion and re-ranking, the visible live hits, their neighbours.

Candidates are the top ``turn_candidates`` hits from ``fts/turns`` (which indexes "speaker:
text") and, when turn vectors are on, the top ``turn_candidates`` turns by cosine to the cue
(:mod:`turn_vectors`); over their union the two are fused
(:func:`~familiar_bot.prompt.retrieval.ranking.fuse_turns`), then what the words cannot say
is added and the best candidates are re-ordered (:mod:`rerank`, each step in turn). Only
turns said in the reply's visible scopes (:mod:`~familiar_bot.prompt.scoping`: its own
server or DM, plus what ``[memory.scopes]`` joins) are candidates at all, filtered by id
before any row is read, so other scopes' turns never crowd a small scope out. The ranked
turns are then filtered: minus the turns ``recent_history`` already shows (the ids actually
in that window, not id arithmetic: ids are global across channels) and minus deleted turns;
while that leaves fewer than the section's hit limit, the ranking is redone deeper.

Each of the best ``turn_neighbour_hits`` hits brings its ``turn_neighbours`` nearest
neighbours before and after in the same channel (the rest come alone); hits join in rank
order while they and their neighbours fit the section's token budget
(:func:`~familiar_bot.prompt.retrieval.render.fit_by_rank`), a long turn as its passage that
best matches the cue's words, else the one whose vector matched it (:mod:`passages`).

:func:`retrieve_turns` is one function because every step reads and rewrites the same
candidate dicts, and a refetch redoes them all on a deeper list; turn rows are read once per
reply (:class:`TurnRows`), in rank order, only as far as the ranking needs them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any, Callable

from familiar_pipeline.storage.scopes import turn_visible
from familiar_pipeline.storage.turns import context_windows

from familiar_bot.prompt.retrieval.genre import asks_advice, asks_its_words
from familiar_bot.prompt.retrieval.passages import cue_tokens, shown_part
from familiar_bot.prompt.retrieval.ranking import MAX_REFETCH_ROUNDS, SCOPE_REFETCH_ROUNDS, fuse_turns, rrf_turns
from familiar_bot.prompt.retrieval.render import fit_by_rank
from familiar_bot.prompt.retrieval.rerank import (SPREAD_DEPTH, TASTE_DEPTH, THREAD_DEPTH, read_cue, time_id_ranges,
                                                  turn_genre, weigh_familiar, with_signals, with_spread,
                                                  with_substance, with_taste, with_threads)
from familiar_bot.prompt.retrieval.spread import asks_for_many, asks_for_order
from familiar_bot.prompt.retrieval.threads import asks_for_now
from familiar_bot.prompt.retrieval.turn_vectors import _dense_turns, _matched_passage, dense_turns_on
from familiar_bot.prompt.scoping import keep_ids, visible_scopes

NEIGHBOUR_SPAN = 3  # how far (in ids) to look for a hit's same-channel neighbours


class TurnRows:
    """Turn rows read once per reply: the ranked hits and their shown neighbours overlap."""

    def __init__(self, log) -> None:
        self.log = log
        self.rows: dict[int, Any] = {}
        self.asked: set[int] = set()

    def get(self, ids) -> list:
        wanted = {i for i in ids if i > 0}
        missing = wanted - self.asked
        if missing:
            self.rows.update((t.id, t) for t in self.log.turns_by_ids(missing))
            self.asked |= missing
        return [self.rows[i] for i in sorted(wanted) if i in self.rows]


def _same_channel_windows(log, span: int, exclude: frozenset[int]) -> Callable[[list[int]], dict[int, list[int]]]:
    """For :func:`~familiar_bot.prompt.retrieval.turn_vectors._dense_turns`: each candidate with its ``span``
    nearest live same-channel turns each side (``context_windows``, the same windows the
    ``turn_window_embedding`` projector embeds).

    Reads only ids and channels (``live_channels``): the blend needs no turn's text, and
    building full turn rows for every window was most of its cost on a large familiar.
    """
    def windows(candidates: list[int]) -> dict[int, list[int]]:
        reach = NEIGHBOUR_SPAN * span
        channel_of = log.live_channels({i for t in candidates for i in range(t - reach, t + reach + 1) if i > 0})
        eligible = {tid: ch for tid, ch in channel_of.items() if tid not in exclude or tid in candidates}
        return context_windows(eligible, candidates, span)
    return windows


def turn_fetch(memory, budget) -> int:
    """How many turn candidates each ranking asks for first (``retrieve_turns`` grows it on a refetch)."""
    return max(memory.config.memory.retrieval.turn_candidates, budget.max_rag_turns)


def retrieve_turns(cue: str, memory, ctx, budget, exclude: frozenset[int],
                   token_budget: int | None = None,
                   first_hits: list[tuple[int, float]] | None = None,
                   scope_counts: dict[str, int] | None = None) -> tuple[list, list[dict]]:
    """Hit turns (not excluded, not deleted, visible here) with their neighbours, ascending by id.

    Candidates are the union of the top ``turn_candidates`` BM25 hits and, when
    turn embeddings are on, the top ``turn_candidates`` turns by cosine; they
    are ranked by :func:`fuse_turns`. If exclusions and deletions leave fewer
    than the budget's ``max_rag_turns``, the candidate depth grows and the
    ranking is redone. With ``token_budget``, hits join in rank order only
    while they and their neighbours fit it (see :func:`fit_by_rank`).
    ``first_hits``: the full-text search of the first round (``turn_fetch`` hits),
    when the caller already ran it. Only turns said in the reply's visible scopes
    (:mod:`~familiar_bot.prompt.scoping`) are candidates; ``scope_counts["turns"]``
    gets how many candidates another scope's turns were.
    """
    retrieval = memory.config.memory.retrieval
    limit = budget.max_rag_turns
    rows_of = TurnRows(memory.turn_log)
    visible = visible_scopes(ctx, memory)
    allowed = memory.scope_turn_ids(visible)
    dense_cache: dict = {"visible": visible}
    out_of_scope: set[int] = set()
    fetch = turn_fetch(memory, budget)
    signals = read_cue(cue, memory, ctx)
    genre = turn_genre(memory, visible)
    id_ranges = time_id_ranges(signals, memory) if signals is not None and dense_turns_on(memory) else []
    kept: list = []
    ranked: list[dict] = []
    round_ = -1
    while True:
        round_ += 1
        hits = first_hits if round_ == 0 and first_hits is not None else memory.fts_turns.search(cue, fetch)
        bm25 = dict(hits)
        dense = _dense_turns(cue, memory, fetch, list(bm25),
                             _same_channel_windows(memory.turn_log, retrieval.turn_context_span, exclude), dense_cache,
                             id_ranges)
        order = [tid for tid, _ in hits] + [tid for tid in sorted(dense, key=lambda t: -dense[t]) if tid not in bm25]
        fuse = rrf_turns if retrieval.turn_fusion == "rrf" else fuse_turns
        fused = fuse(bm25, dense, retrieval.bm25_weight, retrieval.turn_embedding_weight, order)
        fused = [f for f in fused if f["turn_id"] not in exclude]
        # Other scopes' turns go before any row is read (an id lookup), so they cannot crowd this one out.
        keep = keep_ids([f["turn_id"] for f in fused], allowed)
        out_of_scope = {f["turn_id"] for f, k in zip(fused, keep) if not k}
        fused = [f for f, k in zip(fused, keep) if k]
        if signals is not None and signals.active:
            fused = with_signals(fused, signals, memory, rows_of, exclude)
        # A person talking with the familiar: its own replies weigh less (unless the cue asks what it
        # said), and substance, learned among people, stays off (its length bonus lifted every long
        # reply: genre.py).
        if genre.familiar and retrieval.turn_familiar_weight < 1 and not asks_its_words(cue):
            fused = weigh_familiar(fused, rows_of, retrieval.turn_familiar_weight)
        if genre.familiar and retrieval.turn_taste_weight > 0 and asks_advice(cue):
            fused = with_taste(fused, rows_of, retrieval.turn_taste_weight, TASTE_DEPTH * limit)
        if retrieval.turn_substance_depth > 0 and not genre.familiar:
            fused = with_substance(fused, rows_of, retrieval)
        # A question about how one thing stands now follows threads to the newest word; one asking
        # for an order or every time wants every statement, spread over days instead.
        if (retrieval.turn_thread_hits > 0 and dense_cache.get("sims") is not None and asks_for_now(cue)
                and not asks_for_many(cue)):
            fused = with_threads(fused, dense_cache["sims"], rows_of, retrieval, THREAD_DEPTH * limit)
        if retrieval.turn_day_spread > 0 and asks_for_order(cue):
            fused = with_spread(fused, rows_of, memory.config.tz, retrieval, SPREAD_DEPTH * limit)
        kept, ranked = [], []
        # Rows are read in rank order, a few more than still wanted at a time: most
        # candidates rank below the cut and never need their row built.
        at = 0
        while at < len(fused) and len(kept) < limit:
            chunk = fused[at:at + 2 * (limit - len(kept))]
            at += len(chunk)
            rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in chunk)}
            for f in chunk:
                turn = rows.get(f["turn_id"])
                if turn is None or turn.deleted or not turn_visible(turn, visible):
                    continue
                kept.append(turn)
                ranked.append(f)
                if len(kept) == limit:
                    break
        rounds = MAX_REFETCH_ROUNDS + (SCOPE_REFETCH_ROUNDS if out_of_scope else 0)
        if len(kept) >= limit or (len(hits) < fetch and len(dense) < fetch) or round_ >= rounds:
            break
        fetch *= 4
    scores = dense_cache.get("sims")
    raised = scores.raised_by_passage(f["turn_id"] for f in ranked) if scores is not None else {}
    for f in ranked:
        if f["turn_id"] in raised:  # ranked by the passage of it that matched (passage vectors)
            f["passage"] = raised[f["turn_id"]]
    if scope_counts is not None:
        scope_counts["turns"] = len(out_of_scope)
        scope_counts["passage_turns"] = scores.passage_count() if scores is not None else 0
    if not kept:
        return [], []
    reach = retrieval.turn_neighbours
    span = max(NEIGHBOUR_SPAN, 3 * reach)
    # Only the best ``turn_neighbour_hits`` hits bring neighbours; the rest come alone.
    with_context = retrieval.turn_neighbour_hits or len(kept)
    around = ({i for t in kept[:with_context] for i in range(t.id - span, t.id + span + 1) if i > 0}
              if reach else set())
    # Ids and channels first (live turns only), then rows for just the neighbours shown.
    by_channel: dict[int, list[int]] = {}
    for tid, ch in sorted(memory.turn_log.live_channels(around).items()):
        if tid not in exclude:
            by_channel.setdefault(ch, []).append(tid)
    shown: list[list[int]] = []
    for n, hit in enumerate(kept):
        if n >= with_context:
            shown.append([])
            continue
        same = by_channel.get(hit.channel_id, [])
        below, above = bisect_left(same, hit.id), bisect_right(same, hit.id)
        shown.append(same[max(0, below - reach):below] + same[above:above + reach])
    rows = {t.id: t for t in rows_of.get({tid for ids in shown for tid in ids})}
    # a neighbour shows only if the reply may read it too (a joined person's hit in a server
    # brings no one else's turns of that server)
    groups = [[hit] + [rows[tid] for tid in ids if tid in rows and not rows[tid].deleted
                       and turn_visible(rows[tid], visible)] for hit, ids in zip(kept, shown)]
    shown_as = None
    if retrieval.turn_passage_chars > 0:  # a long turn is shown as its passage matching the cue
        tokens, size = cue_tokens(cue), retrieval.turn_passage_chars
        matched = _matched_passage(dense_cache.get("sims"), memory)
        shown_as = lambda t: shown_part(t, tokens, size, lambda: matched(t))  # noqa: E731
    chosen = fit_by_rank(groups, token_budget, shown_as)
    debug = [{k: f[k] for k in ("turn_id", "bm25", "cosine", "total", "speaker", "time", "reply_to", "substance",
                                "updates", "familiar", "taste", "passage")
              if k in f}
             for f in ranked]
    return [chosen[i] for i in sorted(chosen)], debug
