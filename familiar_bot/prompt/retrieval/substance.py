"""Substance: a short pleasantry or a question rarely holds the answer a cue asks for.

Ranking by how well a turn matches the cue, plus who said it (:mod:`turn_signals`),
fills the top with the named person's "Thanks, Mel!" and "Cool! What did it look
like?": the speaker boost is the same for every turn of theirs, and such turns differ
from the evidence by small text-match margins. A second pass over the best
``turn_substance_depth`` candidates re-orders them by

    total / best total + length_weight x ln(1 + content tokens) - question_weight x [asks]

where content tokens are the full-text analyzer's (stopwords out, stemmed; capped at
:data:`TOKEN_CAP`, so a long paste gets no unbounded lift) and "asks" is a question
mark (a question's answer is the reply after it, which ``turn_reply_credit`` favours).
It is the small linear re-ranker that a pairwise fit on LoCoMo chose (length and
question, over the fused total), kept as two knobs (docs/benchmarks.md, "Substance").

The change is written back into ``total`` in the head's own units (``delta x best
total``), so later steps (threads, spread) compare like with like; the rest of the
candidates follow the head as ranked. Plain functions over the candidate dicts
:mod:`turns` ranks (``turn_id``, ``total``); :func:`rerank.with_substance` calls them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from familiar_pipeline.storage.fts import analyze

TOKEN_CAP = 64  # content tokens that still count: past it, length is no more evidence
TEXT_CHARS = 4000  # a turn's head that is analysed (a long paste costs no more than its head)


def content_tokens(text: str) -> int:
    """How many analyzer tokens the head of ``text`` has, capped at :data:`TOKEN_CAP`."""
    return min(TOKEN_CAP, len(analyze(text[:TEXT_CHARS])))


def substance(text: str, length_weight: float, question_weight: float) -> float:
    """A turn's substance term: its length prior minus the question penalty (units of the best total)."""
    return length_weight * math.log1p(content_tokens(text)) - (question_weight if "?" in text else 0.0)


def rerank_by_substance(fused: list[dict], rows: Mapping[int, Any], depth: int,
                        length_weight: float, question_weight: float) -> list[dict]:
    """``fused`` (best first) with its first ``depth`` candidates re-ordered by substance.

    ``rows``: turn id -> turn (a candidate without a row keeps its total). Each head
    candidate comes back as a copy with ``substance`` (the term above) and ``best x
    substance`` added to its ``total``; ties keep the incoming order; the tail follows
    unchanged; ``fused`` itself is not changed. Does nothing when both weights are 0
    or the best total is not positive.
    """
    if depth <= 0 or (length_weight <= 0 and question_weight <= 0) or not fused:
        return fused
    best = max(f["total"] for f in fused[:depth])
    if best <= 0:
        return fused
    head, tail = [dict(f) for f in fused[:depth]], fused[depth:]
    for f in head:
        turn = rows.get(f["turn_id"])
        if turn is None:
            continue
        term = substance(turn.content or "", length_weight, question_weight)
        f["substance"] = round(term, 4)
        f["total"] += best * term
    order = sorted(range(len(head)), key=lambda i: (-head[i]["total"], i))
    return [head[i] for i in order] + tail
