"""The newer word wins: on a question about how things stand now, a later update ranks above what it updates.

When someone changes their mind ("the demo is on the 7th" ... weeks later "we pushed it
to the 14th"), the question ("when is the demo?") shares its words with the old turn,
not the update, so ranking by similarity to the cue puts the old value first. This
module follows a matched turn's thread forward: among the ranked candidates, every
later turn by the same person that says a word of change (:data:`UPDATE_WORDS`) and
whose vector (with its context window, the same rows the cue is scored against) is
close enough to a strong hit's is taken as an update of it, and is lifted just above
it, newer above older. No model is asked.

Only questions about the present state are followed (:func:`asks_for_now`: "when is the
demo?", "what's my rabbit called?", "which library am I using?"). A question about what
happened ("what did Caroline paint?", "when was the trip?") wants the episode it names,
and on LoCoMo, where two people come back to the same subjects in many sessions, following
every question's thread to a later same-person turn cost points of any@10
(docs/benchmarks.md, "Threads and spread", the first design).

Plain functions over the candidate dicts :mod:`turns` ranks (``turn_id``, ``total``)
and the turn rows; :func:`rerank.with_threads` calls :func:`follow_threads`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

# Words people use when they change what they said before ("we pushed it to the 14th",
# "switched to pytest", "scratch that", "it's Kyoto now", "we're down to two cats"): a later
# turn on the subject without one ("the demo went well") is news about it, not a new value.
UPDATE_WORDS = re.compile(
    r"\b(?:now|instead|anymore|no longer|no more|actually|after all|in the end|these days|from now|scratch|never mind"
    r"|correction|changed?|changes|changing|switch(?:ed|ing)?|mov(?:ed|ing)|push(?:ed)?|postponed?|reschedul\w*"
    r"|delayed|brought forward|bump(?:ed)?|slipp?(?:ed)?|cancel+ed|replac\w*|swapp?\w*|upgrad\w*|downgrad\w*"
    r"|updated?|renamed?|ended up|turn(?:s|ed) out|went (?:with|for|from|up|down)|going with|started (?:calling|using)"
    r"|dropped|decided|fell through|new (?:plan|number|date)|(?:up|down|back) to|raised|lowered|upped|increased"
    r"|decreased|grew|shr[au]nk|reduced|trimm?(?:ed)?|cut)\b",
    re.IGNORECASE)


UPDATE_CHARS = 1000  # a change is said early; a long paste searched whole was slow (docs/benchmarks.md, "Threads and spread")


def says_update(text: str) -> bool:
    """Whether a turn uses a word of change (:data:`UPDATE_WORDS`) in its first ``UPDATE_CHARS``."""
    return bool(UPDATE_WORDS.search((text or "")[:UPDATE_CHARS]))


# A lifted turn lands this far above the turn it updates, plus up to as much again by how
# late it was said (the fused totals are sums of signals each in [0, 1], so this only orders
# the thread, newest first, never jumps a third turn's gap).
LIFT = 1e-3


def follow_threads(fused: list[dict], rows: Mapping[int, Any], vectors: Mapping[int, np.ndarray],
                   *, hits: int, threshold: float, passes: int = 3) -> list[dict]:
    """``fused`` (best first) with later updates lifted above the hits they update.

    Each of the best ``hits`` candidates is followed to every later candidate by the
    same author that says a word of change (:func:`says_update`) and whose unit
    vector's cosine with the hit's is at least ``threshold``: each gets ``total =
    max(its own, hit's total + LIFT x (1 + its place in time))``, so the newest ends on
    top. The pass is repeated on the new order, so a chain of updates (Lisbon, then
    Montreal, then Kyoto) ends newest first. Candidates without a row or a vector are
    left as ranked. Returns a new list, re-sorted (ties keep the incoming order); a
    lifted candidate records ``updates``: the id of the turn it was lifted above, for
    ``/context`` and the renderer.
    """
    if hits <= 0 or len(fused) < 2:
        return fused
    out = [dict(f) for f in fused]
    usable = [f for f in out if f["turn_id"] in vectors and f["turn_id"] in rows]
    if len(usable) < 2:
        return out
    ids = np.array([f["turn_id"] for f in usable])
    changes = np.array([says_update(rows[int(t)].content) for t in ids], dtype=bool)
    if not changes.any():  # no candidate says a word of change: nothing updates anything
        return out
    vecs = np.stack([vectors[f["turn_id"]] for f in usable])
    # links[h, c]: candidate c is a later update of candidate h (computed once for every pass)
    links = (ids[None, :] > ids[:, None]) & changes[None, :] & ((vecs @ vecs.T) >= threshold)
    # said by one participant (a turn without an author key never updates a person's), and never the
    # familiar's own replies: what it told someone is not the person changing their mind (issue 48)
    authors = np.array(["" if getattr(rows[int(t)], "role", None) == "assistant" else rows[int(t)].author_key or ""
                        for t in ids], dtype=object)
    links &= (authors[:, None] == authors[None, :]) & (authors != "")[:, None]
    followed = {int(ids[h]): np.flatnonzero(links[h]) for h in np.flatnonzero(links.any(axis=1))}
    if not followed:
        return out
    lateness = (ids.argsort().argsort() + 1) / len(ids)  # 1/n for the oldest candidate .. 1 for the newest
    for _ in range(passes):
        changed = False
        for hit in [f for f in out[:hits] if f["turn_id"] in followed]:
            for c in followed[hit["turn_id"]]:
                later = usable[int(c)]
                lifted = hit["total"] + LIFT * (1.0 + float(lateness[c]))
                if lifted > later["total"]:
                    later["total"] = lifted
                    later["updates"] = hit["turn_id"]
                    changed = True
        order = {id(f): n for n, f in enumerate(out)}
        out.sort(key=lambda f: (-f["total"], order[id(f)]))
        if not changed:
            break
    return out


# A question about how things stand now ("when is the demo?", "what's my rabbit called?",
# "which library am I using?", "where do I work?", "what did we settle on for the rent?"):
# the newest statement answers it. A question about what happened ("what did Caroline
# research?", "when was the trip?", "how did the interview go?") wants the episode it names.
_DECIDED = r"(?:i|we) (?:pick|choose|chose|settle|decide|go with|give|call|name|agree|set|land)\b"
_NOW = re.compile(
    r"\b(?:what|when|where|which|who|how)\b[^?.!]{0,60}?\b(?:is|are|am)\b|\b(?:what|when|where|who|how)'s\b"
    r"|\bremind me\b|\b(?:do|does) (?:i|we|you|they|he|she|my|our)\b|\bdid " + _DECIDED,
    re.IGNORECASE)
_THEN = re.compile(r"\b(?:was|were|had|happened|used to|ago|last (?:week|month|year)|yesterday)\b"
                   r"|\bdid (?!" + _DECIDED + ")", re.IGNORECASE)
CUE_CHARS = 2000  # a question's head: what is asked is said early, and a long paste is not a question


def asks_for_now(cue: str) -> bool:
    """Whether the cue asks how something stands now, not what happened (reads the cue's head only)."""
    cue = (cue or "")[:CUE_CHARS]
    return bool(_NOW.search(cue)) and not _THEN.search(cue)
