"""The hub: one reply's ``rag_context`` section, facts then earlier turns, and its debug structure.

:func:`retrieve` runs the turns' full-text search first (it needs no cue vector, so it runs
while the cue's embedding, started early by ``rag_context``'s ``prefetch``, is computed),
then the facts (:mod:`facts`), then the turns within what the facts left of the section's
token budget (:mod:`turns`), and renders both (:mod:`render`). Its debug structure is what
``/context`` shows and what the evaluators score: every candidate's signals, what each
scope filter left out, the genre the turns were ranked for, and which facts and turns the
rendered section really shows. :func:`needs_cue_vector` is what ``rag_context`` asks
before starting that embedding.
"""

from __future__ import annotations

from typing import Any

from familiar_pipeline.projectors.fact_embeddings.tables import fact_vector_count
from familiar_pipeline.projectors.turn_embeddings.tables import turn_matrix

from familiar_bot.prompt.layers.common import one_line
from familiar_bot.prompt.retrieval.facts import rename_note, retrieve_facts
from familiar_bot.prompt.retrieval.render import NEWEST_FIRST_HEADER, TURNS_HEADER, owned_turn_lines, render_counted
from familiar_bot.prompt.retrieval.rerank import turn_genre
from familiar_bot.prompt.retrieval.turn_vectors import dense_turns_on
from familiar_bot.prompt.retrieval.turns import retrieve_turns, turn_fetch
from familiar_bot.prompt.scoping import visible_scopes
from familiar_bot.prompt.tokens import cap_blocks, estimate_tokens


def needs_cue_vector(memory) -> bool:
    """Whether a reply here will embed its cue: cosines are on for facts or turns and the
    snapshot holds vectors under the embedder's model for them (a cold side-index costs
    no model call). What ``rag_context`` checks before starting the embedding early."""
    embedder = memory.embedder
    if embedder is None:
        return False
    snapshot = memory.snapshot
    if memory.config.memory.retrieval.embedding_weight > 0 and fact_vector_count(snapshot, embedder.name) > 0:
        return True
    return dense_turns_on(memory) and len(turn_matrix(snapshot, embedder.name)[0]) > 0


def retrieve(ctx, memory, exclude: frozenset[int]) -> tuple[str, dict[str, Any]]:
    """The rendered ``rag_context`` section for ``ctx.cue`` and its debug structure."""
    cue = ctx.cue.strip()
    if not cue:
        return "", {"cue": "", "facts": [], "turns": [], "scope_excluded": 0}
    budget = memory.config.budget_for(ctx.tier)
    labels = memory.labels(ctx.guild_id)
    # The turns' full-text search does not need the cue's vector: run it before the facts'
    # cosines wait for that vector, while the model call (started by ``prefetch``) runs.
    first_hits = memory.fts_turns.search(cue, turn_fetch(memory, budget))
    visible = visible_scopes(ctx, memory)
    facts, debug = retrieve_facts(cue, memory, budget, visible)
    fact_lines = [f"- {one_line(f.text)}{rename_note(f, labels)}" for f in facts]
    fact_tokens = sum(estimate_tokens(line) for line in cap_blocks(fact_lines, budget.rag_tokens))
    scope_counts: dict[str, int] = {}
    turns, turn_debug = retrieve_turns(cue, memory, ctx, budget, exclude,
                                       token_budget=max(0, budget.rag_tokens - fact_tokens),
                                       first_hits=first_hits, scope_counts=scope_counts)
    debug["scope_excluded_turns"] = scope_counts.get("turns", 0)
    debug["turn_genre"] = turn_genre(memory, visible).debug()
    # Passage vectors (turn_passage_embedding): the long turns that have them, and the ranked turns
    # whose cosine their best passage raised.
    debug["turn_passages"] = {"turns_with_vectors": scope_counts.get("passage_turns", 0),
                              "ranked_by_passage": sum("passage" in f for f in turn_debug)}
    debug["scope_excluded"] = debug["scope_excluded_facts"] + debug["scope_excluded_turns"]
    debug["turns"] = turn_debug
    debug["excluded_recent"] = len(exclude)
    # A followed thread whose both ends are shown: newest day first (see NEWEST_FIRST_HEADER).
    shown_ids = {t.id for t in turns}
    threads = [[f["updates"], f["turn_id"]] for f in turn_debug
               if "updates" in f and f["turn_id"] in shown_ids and f["updates"] in shown_ids]
    if threads:
        debug["threads"] = threads
    owned = owned_turn_lines(turns, labels, memory.config.tz, newest_first=bool(threads))
    text, facts_kept, lines_kept = render_counted(fact_lines, [(k, line) for k, line, _ in owned],
                                                  budget.rag_tokens,
                                                  NEWEST_FIRST_HEADER if threads else TURNS_HEADER)
    # What the section really shows after the token cut: the evaluation's rendered recall reads these.
    debug["shown_fact_ids"] = [f.id for f in facts[:facts_kept]]
    debug["shown_turn_ids"] = sorted({tid for _, _, tid in owned[:lines_kept] if tid is not None})
    return text, debug
