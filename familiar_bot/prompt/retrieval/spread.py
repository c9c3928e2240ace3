"""Spread over days: a question about an order or every time sees evidence from many days.

"In what order did I bring up the roof, the vet and the taxes?", "list every time I
mentioned the gym", "how often do I go running?": the answer is spread over many
sessions, while ranking by similarity fills the top with the one or two sessions that
talk about the subject most. For such cues (:func:`asks_for_order`) the best candidates
are re-picked greedily, each pick lowering the others said the same local day in the
same channel (:func:`spread_days`), an MMR with a same-day similarity. Other questions
are left as ranked: on LoCoMo, spreading every question cost points of any@10, and
spreading every list question ("What items has Melanie bought?") still cost some, because
that evidence sits in one session next to the question (docs/benchmarks.md, "Threads and
spread", and the session diversity row of "Who and when").

:func:`asks_for_many` (a list, an order, every time, several named things) is the wider
test: such a question wants every statement, so threads (:mod:`threads`) are not followed
for it. Plain functions over the candidate dicts :mod:`turns` ranks (``turn_id``,
``total``); :func:`turns.retrieve_turns` and :func:`rerank.with_spread` call them.
"""

from __future__ import annotations

import re
from typing import Any, Hashable, Mapping

# Words that ask for more than one thing: a list, every time, an order, a count of times,
# a timeline; or a question naming several things ("X, Y and Z"). The items' lengths are
# bounded, so a search is linear in the cue: an unbounded `[...]*,` tried from every start
# of a long message without a comma was slow (docs/benchmarks.md, "Threads and spread").
_MANY = re.compile(
    # "each week" / "every morning" is a recurrence ("when is the book club each week?"), not many things
    r"\b(?:both|all|(?:every|each)(?! (?:week|day|month|year|morning|evening|night|weekend)\b)|everything|list"
    r"|order|sequence|timeline|over time|how many times|how often"
    r"|(?:what|which) (?:kinds?|types?|sorts?) of)\b"
    r"|\w[\w' -]{0,60},[\w' -]{1,60},?\s+(?:and|or)\s+\w", re.IGNORECASE)
# Words that ask for an order or for every time something was said ("in what order did I
# bring up...", "which did I mention first: a, b or c?", "how often do I...", "what have I said
# about the gym over time?", "when did I talk about my brother?").
_ORDER = re.compile(
    r"\b(?:in (?:what|which) order|the order|order (?:in which|i|we|they)|(?:the|what) sequence|sequence in which"
    r"|timeline|chronolog\w*|every time|each time|how many times|how often|over time"
    r"|when did (?:i|we) (?:talk|mention|bring|say|tell|speak)"
    r"|sort\w*\b.{0,80}?\bwhen|first:|(?:mention|bring|brought|talk|told|said|rais)\w*\b.{0,40}?\b(?:first|before)\b)",
    re.IGNORECASE)
CUE_CHARS = 2000  # a question's head: what is asked is said early, and a long paste is not a question
# "what books ...", "which cities ...", "what board games ...": a plural noun right after the
# question word, or one word later. Not a verb or a pronoun that ends in s; after a verb
# ("what did James ...") the next word is the subject, not what is asked for.
_ASKED = re.compile(r"\b(?:what|which)\s+(\w+)(?:\s+(\w+))?", re.IGNORECASE)
_NOT_PLURAL = frozenset({"is", "was", "does", "has", "his", "this", "its", "us", "yes", "as", "plus", "thus",
                         "always", "perhaps", "whereas", "news", "means", "series", "species", "hers", "ours",
                         "yours", "theirs"})
_VERBS = frozenset({"is", "was", "are", "were", "do", "does", "did", "has", "have", "had", "can", "could", "will",
                    "would", "should", "shall", "may", "might", "must", "am", "be"})


def _plural(word: str | None) -> bool:
    word = (word or "").lower()
    return len(word) > 2 and word.endswith("s") and not word.endswith("ss") and word not in _NOT_PLURAL


def asks_for_many(cue: str) -> bool:
    """Whether the cue asks for a list, an order or every time (not for one answer); reads its head only."""
    cue = (cue or "")[:CUE_CHARS]
    if _MANY.search(cue):
        return True
    match = _ASKED.search(cue)
    if not match:
        return False
    first, second = match.group(1), match.group(2)
    if _plural(first):
        return True
    return first.lower() not in _VERBS and _plural(second)


def asks_for_order(cue: str) -> bool:
    """Whether the cue asks for an order or for every time (reads its head only)."""
    return bool(_ORDER.search((cue or "")[:CUE_CHARS]))


def spread_days(fused: list[dict], day_of: Mapping[int, Hashable], penalty: float, depth: int,
                keep: int = 0) -> list[dict]:
    """``fused`` (best first) with its first ``depth`` candidates re-picked greedily.

    The first ``keep`` stay where they are; then each pick is the candidate with the
    best ``total - penalty x (how many already picked share its day)``, ``day_of`` giving
    a candidate's day key (channel and local date; a candidate without one is never
    lowered). Ties keep the incoming order; the rest (below ``depth``) follows as ranked.
    ``total`` is not changed: only the order.
    """
    if penalty <= 0 or len(fused) < 2:
        return fused
    head, tail = fused[:depth], fused[depth:]
    count: dict[Any, int] = {}

    def took(f: dict) -> None:
        key = day_of.get(f["turn_id"])
        if key is not None:
            count[key] = count.get(key, 0) + 1

    out = list(head[:keep])
    for f in out:
        took(f)
    left = list(head[keep:])
    while left:
        best = max(range(len(left)),
                   key=lambda i: (left[i]["total"] - penalty * count.get(day_of.get(left[i]["turn_id"]), 0), -i))
        took(left[best])
        out.append(left.pop(best))
    return out + tail
