"""The newer word wins: a later turn on the same subject ranks just above the one it updates.

When someone changes their mind ("the demo is on the 7th" ... weeks later "we pushed it
to the 14th"), the question ("when is the demo?") shares its words with the old turn,
not the update, so ranking by similarity to the cue puts the old value first. This
module follows a matched turn's thread forward: among the ranked candidates, a later
turn by the same person whose vector (with its context window, the same rows the
cue is scored against) is close to a strong hit's is taken as the same subject, and
is lifted just above that hit. No model is asked; a turn that merely shares a topic
with the hit but says nothing new still only moves up one place.

Plain functions over the candidate dicts ``retrieval`` ranks (``turn_id``, ``total``)
and the turn rows; ``retrieval.retrieve_turns`` calls :func:`follow_threads`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

# Words people use when they change what they said before ("we pushed it to the 14th",
# "switched to pytest", "scratch that", "it's Kyoto now"): a later turn holding one is more
# likely an update of a close earlier turn than a turn that merely shares its topic.
UPDATE_WORDS = re.compile(
    r"\b(?:now|instead|anymore|no longer|actually|after all|scratch that|changed?|changing|switch(?:ed|ing)?"
    r"|mov(?:ed|ing)|push(?:ed)?|postponed?|reschedul\w*|cancel+ed|replac\w*|swapp?\w*|upgrad\w*|downgrad\w*"
    r"|updated?|renamed?|ended up|turn(?:s|ed) out|went (?:with|for|from|up|down)|dropped|decided|new (?:plan|number|date))\b",
    re.IGNORECASE)


def says_update(text: str) -> bool:
    """Whether a turn uses a word of change (:data:`UPDATE_WORDS`)."""
    return bool(UPDATE_WORDS.search(text or ""))


# A lifted turn lands this far above the turn it updates (the fused totals are sums of
# signals each in [0, 1], so this only orders the pair, never jumps a third turn's gap).
LIFT = 1e-3


def same_author(a, b) -> bool:
    """Both turns said by one participant (the familiar's own turns never update a person's)."""
    if a.author_key or b.author_key:
        return bool(a.author_key) and a.author_key == b.author_key
    return False


def follow_threads(fused: list[dict], rows: Mapping[int, Any], vectors: Mapping[int, np.ndarray],
                   *, hits: int, threshold: float, update_bonus: float = 0.0, passes: int = 3) -> list[dict]:
    """``fused`` (best first) with later same-subject turns lifted above the hits they update.

    Each of the best ``hits`` candidates is followed to its closest later candidate by
    the same author (cosine of their unit vectors at least ``threshold``), which gets
    ``total = max(its own, hit's total + LIFT)``. The pass is repeated on the new
    order, so a chain of updates (Lisbon, then Montreal, then Kyoto) ends with the
    newest on top. Candidates without a row or a vector are left as ranked. Returns a
    new list, re-sorted (ties keep the incoming order); a lifted candidate records
    ``updates``: the id of the turn it was lifted above, for ``/context`` and the renderer.
    """
    if hits <= 0 or len(fused) < 2:
        return fused
    out = [dict(f) for f in fused]
    usable = [f for f in out if f["turn_id"] in vectors and f["turn_id"] in rows]
    if len(usable) < 2:
        return out
    index = {f["turn_id"]: n for n, f in enumerate(usable)}
    matrix = np.stack([vectors[f["turn_id"]] for f in usable])
    sims = matrix @ matrix.T
    # a word of change makes a later turn closer to what it may update
    sims += update_bonus * np.array([says_update(rows[f["turn_id"]].content) for f in usable], dtype=np.float32)
    ids = np.array([f["turn_id"] for f in usable])
    for _ in range(passes):
        changed = False
        for hit in [f for f in out[:hits] if f["turn_id"] in index]:
            h = index[hit["turn_id"]]
            close = np.flatnonzero((ids > hit["turn_id"]) & (sims[h] >= threshold))
            hit_turn = rows[hit["turn_id"]]
            later = [int(c) for c in close if same_author(rows[int(ids[c])], hit_turn)]
            if not later:
                continue
            best = usable[max(later, key=lambda c: sims[h, c])]
            lifted = hit["total"] + LIFT
            if lifted > best["total"]:
                best["total"] = lifted
                best["updates"] = hit["turn_id"]
                changed = True
        order = {id(f): n for n, f in enumerate(out)}
        out.sort(key=lambda f: (-f["total"], order[id(f)]))
        if not changed:
            break
    return out
