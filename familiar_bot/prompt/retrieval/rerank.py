"""The steps after fusion, in the order :func:`~familiar_bot.prompt.retrieval.turns.retrieve_turns` runs them.

What the words cannot say is added to the fused turn ranking, then its best candidates are
re-ordered; each step here reads the rows its re-ranker needs and calls it:

* who and when (:func:`read_cue`, :func:`with_signals`; :mod:`turn_signals`, with
  :mod:`cue_people` and :mod:`cue_time` reading the cue): turns by the people the cue names
  count (turns addressed to them do not), turns said in a window the cue names count (those
  turns also join the candidates by cosine: :func:`time_id_ranges`), and the reply after a
  matching question gains its credit;
* the genre (:func:`turn_genre`, :mod:`genre`): where a person talks with the familiar, its
  long replies weigh less (:func:`weigh_familiar`, unless the cue asks what it said) and a
  request for advice favours the person's own taste (:func:`with_taste`);
* substance (:func:`with_substance`, :mod:`substance`): a short pleasantry or a question gives
  way to a turn with content; off in the familiar genre;
* threads (:func:`with_threads`, :mod:`threads`): on a question about how a thing stands now,
  a later update is lifted above what it updates;
* spread (:func:`with_spread`, :mod:`spread`): on a question about an order or every time,
  the best candidates are spread over days.

The re-rankers are plain functions over the candidate dicts and turn rows; this module is
where they meet the memory view, rows read once per reply (:class:`~.turns.TurnRows`), and
where a step that cannot read its input ranks as before, with a warning once, so a reply
never fails because of it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from familiar_bot.prompt.layers.common import local_date
from familiar_bot.prompt.retrieval.cue_people import PeopleCue, read_people
from familiar_bot.prompt.retrieval.cue_time import TimeCue, parse_time_cue
from familiar_bot.prompt.retrieval.genre import FAMILIAR, PEOPLE, Genre, is_familiars, scope_genre, tells_taste
from familiar_bot.prompt.retrieval.spread import spread_days
from familiar_bot.prompt.retrieval.substance import rerank_by_substance
from familiar_bot.prompt.retrieval.threads import follow_threads
from familiar_bot.prompt.retrieval.turn_signals import (CueSignals, add_signals, credit_replies, next_replies,
                                                        window_id_ranges)

if TYPE_CHECKING:
    from familiar_bot.prompt.retrieval.turn_vectors import TurnScores
    from familiar_bot.prompt.retrieval.turns import TurnRows


def read_cue(cue: str, memory, ctx) -> CueSignals | None:
    """Who and when the cue names (:class:`CueSignals`), or None when no signal is weighted.

    Never raises: a cue that cannot be read (or a turn log that cannot be) ranks
    by its words alone, with a warning once."""
    knobs = memory.config.memory.retrieval
    if not (knobs.turn_speaker_weight > 0 or knobs.turn_time_weight > 0 or knobs.turn_reply_credit > 0):
        return None
    tz = memory.config.tz
    try:
        people = read_people(cue, memory.people_directory()) if knobs.turn_speaker_weight > 0 else PeopleCue()
        now = getattr(ctx, "now", None) or datetime.now(timezone.utc)
        when = parse_time_cue(cue, now, tz) if knobs.turn_time_weight > 0 else TimeCue()
    except Exception as exc:  # a reply must not fail because of its cue
        memory.warn_once("cue-signals", "reading who and when the cue names failed (%s: %s); "
                         "ranking turns by their words alone", type(exc).__name__, exc)
        return None
    return CueSignals(people, when, tz, knobs)


def time_id_ranges(signals: CueSignals, memory) -> list[tuple[int, int]]:
    """Turn-id ranges of the windows the cue names (empty without a weighted, dated cue)."""
    if signals.knobs.turn_time_weight <= 0 or not signals.time.windows:
        return []
    try:
        return window_id_ranges(memory.turn_log, signals.time.windows, signals.tz, signals.knobs.turn_time_slack_days)
    except Exception as exc:
        memory.warn_once("cue-time-ids", "finding the turns of the cue's dates failed (%s: %s)",
                         type(exc).__name__, exc)
        return []


def with_signals(fused: list[dict], signals: CueSignals, memory, rows_of: "TurnRows",
                 exclude: frozenset[int]) -> list[dict]:
    """``fused`` with the replies' credit and the speaker and time boosts (:mod:`turn_signals`)."""
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in fused)}
    fused = credit_replies(fused, rows, lambda questions: next_replies(
        questions, memory.turn_log.live_channels, rows_of.get), signals.knobs.turn_reply_credit)
    fused = [f for f in fused if f["turn_id"] not in exclude]
    rows.update((t.id, t) for t in rows_of.get(f["turn_id"] for f in fused if f["turn_id"] not in rows))
    return add_signals(fused, rows, signals)


def turn_genre(memory, visible: tuple[str, ...]) -> Genre:
    """The genre the turns are ranked for: ``turn_genre`` when forced, else read from the scope
    (:func:`~familiar_bot.prompt.retrieval.genre.scope_genre`); a log that cannot be read ranks as people."""
    forced = memory.config.memory.retrieval.turn_genre
    if forced in (PEOPLE, FAMILIAR):
        return Genre(forced)
    try:
        return scope_genre(memory, visible)
    except Exception as exc:  # a reply must not fail because its genre could not be read
        memory.warn_once("turn-genre", "reading the genre of the scope's talk failed (%s: %s); ranking as "
                         "people talking", type(exc).__name__, exc)
        return Genre(PEOPLE)


def weigh_familiar(fused: list[dict], rows_of: "TurnRows", weight: float) -> list[dict]:
    """``fused`` with the familiar's own replies' totals multiplied by ``weight``, re-sorted
    (ties keep the order); each weighed candidate records ``familiar`` for ``/context``."""
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in fused)}
    out = []
    for f in fused:
        turn = rows.get(f["turn_id"])
        if turn is not None and is_familiars(turn):
            f = {**f, "total": f["total"] * weight, "familiar": weight}
        out.append(f)
    order = {id(f): n for n, f in enumerate(out)}
    return sorted(out, key=lambda f: (-f["total"], order[id(f)]))


TASTE_DEPTH = 3  # candidates (x the section's hit limit) read for the person's taste


def with_taste(fused: list[dict], rows_of: "TurnRows", weight: float, depth: int) -> list[dict]:
    """A cue asking the familiar's advice: the person's turns among the best ``depth`` candidates that
    tell their taste or situation (:func:`~familiar_bot.prompt.retrieval.genre.tells_taste`) gain ``weight``."""
    head, tail = [dict(f) for f in fused[:depth]], fused[depth:]
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in head)}
    for f in head:
        turn = rows.get(f["turn_id"])
        if turn is not None and not is_familiars(turn) and tells_taste(turn.content or ""):
            f["total"] += weight
            f["taste"] = weight
    order = sorted(range(len(head)), key=lambda i: (-head[i]["total"], i))
    return [head[i] for i in order] + tail


def with_substance(fused: list[dict], rows_of: "TurnRows", knobs) -> list[dict]:
    """``fused`` with its best candidates re-ordered by their substance (:mod:`substance`)."""
    depth = knobs.turn_substance_depth
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in fused[:depth])}
    return rerank_by_substance(fused, rows, depth, knobs.turn_substance_length, knobs.turn_substance_question)


THREAD_DEPTH = 3  # candidates (x the section's hit limit) a thread is followed among


def with_threads(fused: list[dict], scores: "TurnScores", rows_of: "TurnRows", knobs, depth: int) -> list[dict]:
    """``fused`` with later same-subject turns lifted above the hits they update (:mod:`threads`)."""
    head, tail = fused[:depth], fused[depth:]
    rows = {t.id: t for t in rows_of.get(f["turn_id"] for f in head)}
    want = np.fromiter((f["turn_id"] for f in head), dtype=np.int64)
    at = np.minimum(np.searchsorted(scores.ids, want), max(0, len(scores.ids) - 1))
    found = scores.ids[at] == want if len(scores.ids) else np.zeros(len(want), dtype=bool)
    vectors = {int(tid): scores.matrix[row] for tid, row, ok in zip(want, at, found) if ok}
    return follow_threads(head, rows, vectors, hits=knobs.turn_thread_hits,
                          threshold=knobs.turn_thread_similarity) + tail


SPREAD_DEPTH = 3  # candidates (x the section's hit limit) a list question's days are spread among


def with_spread(fused: list[dict], rows_of: "TurnRows", tz, knobs, depth: int) -> list[dict]:
    """``fused`` with a list question's best candidates spread over days (:mod:`spread`)."""
    rows = rows_of.get(f["turn_id"] for f in fused[:depth])
    day_of = {t.id: (t.channel_id, local_date(t.created_at, tz)) for t in rows}
    return spread_days(fused, day_of, knobs.turn_day_spread, depth, keep=knobs.turn_day_spread_keep)
