"""The section's text: which hit groups fit the token budget, the turn lines by date, the render and its cut.

Facts come first, then turns, each part under its header, within the section's token
budget. Turns are grouped by date in ``display_tz``, days in time order, or newest first
when a thread was followed (:data:`NEWEST_FIRST_HEADER`). Which hits are shown at all is
decided before the render, in rank order (:func:`fit_by_rank`), so the cut never falls on
the latest turns whatever their rank. The debug structure records which facts and turns
survived the cut (``shown_fact_ids``, ``shown_turn_ids``), which the LoCoMo evaluation
scores as rendered recall: :func:`render_counted` says how many lines were kept and
:func:`owned_turn_lines` which turn each line quotes.
"""

from __future__ import annotations

from typing import Any, Callable

from familiar_bot.prompt.layers.common import Labels, clock_12h, local_date
from familiar_bot.prompt.tokens import cap_blocks, estimate_tokens, truncate_to_tokens

FACTS_HEADER = "## Possibly relevant facts"
TURNS_HEADER = "## Possibly relevant earlier turns"
# When a thread was followed (a later turn on the same subject lifted above an earlier one,
# :mod:`threads`), the days are listed newest first and the header says so, so the reply
# can tell the current word from the old one ("it used to be the 7th, now the 14th").
NEWEST_FIRST_HEADER = TURNS_HEADER + " (newest first: a later turn may update an earlier one)"
GROUP_SLACK_TOKENS = 8  # a date header and a blank line a hit's group may add


def fit_by_rank(groups: list[list], token_budget: int | None,
                shown_as: Callable[[Any], Any] | None = None) -> dict[int, Any]:
    """``{id: turn}`` of the hit groups (a hit and its neighbours, best hit first) that fit the budget.

    The section is shown in time order and cut at the token budget, so without
    this step the cut fell on the *latest* turns, whatever their rank, and
    rendered recall on LoCoMo fell with it (docs/benchmarks.md, "What each idea
    gained or lost", the render rows). Whole groups are taken in rank order while their
    estimated lines fit; the first group always comes (the renderer truncates it). ``shown_as``
    turns a row into what the section shows of it (a long turn's passage: :mod:`passages`), applied
    only to the groups reached, so a turn that cannot fit costs nothing.
    """
    chosen: dict[int, Any] = {}
    used = 0
    for group in groups:
        new = [t for t in group if t.id not in chosen]
        if shown_as is not None:
            new = [shown_as(t) for t in new]
        if token_budget is not None:
            cost = sum(estimate_tokens(f"> [12:00 pm {getattr(t, 'author_display', None) or ''}]: {t.content}")
                       for t in new)
            cost += GROUP_SLACK_TOKENS if new else 0
            if chosen and used + cost > token_budget:
                break
            used += cost
        for t in new:
            chosen[t.id] = t
    return chosen


def owned_turn_lines(turns: list, labels: Labels, tz, newest_first: bool = False) -> list[tuple[str, str, int | None]]:
    """``(kind, line, turn id)``: date headers, quoted turn lines and blank separators, with the id
    of the turn each line quotes (None for headers and blanks),
    so the caller can tell which turns survived the token budget. Days in time order, or
    with ``newest_first`` the latest day first (each day's turns still in time order)."""
    lines: list[tuple[str, str, int | None]] = []
    day = None
    ordered = sorted(turns, key=lambda t: (t.created_at, t.id))
    if newest_first:
        by_day: dict[Any, list] = {}
        for t in ordered:
            by_day.setdefault(local_date(t.created_at, tz), []).append(t)
        ordered = [t for date in sorted(by_day, reverse=True) for t in by_day[date]]
    for t in ordered:
        date = local_date(t.created_at, tz)
        if date != day:
            if day is not None:
                lines.append(("blank", "", None))
            lines.append(("date", f"{date}:", None))
            day = date
        body = labels.rewrite_mentions(t.content).splitlines() or [""]
        lines.append(("turn", f"> [{clock_12h(t.created_at, tz)} {labels.for_turn(t)}]: {body[0]}", t.id))
        lines.extend(("turn", f"> {line}" if line.strip() else ">", t.id) for line in body[1:])
    return lines


def render(fact_lines: list[str], turn_part: list[tuple[str, str]], max_tokens: int,
           turns_header: str = TURNS_HEADER) -> str:
    """Facts first, then turns, within ``max_tokens`` (headers not counted).

    A line that does not fit ends its part once something is kept; the first
    kept line is truncated if it alone is too big. A date header left without
    its turns is dropped.
    """
    return render_counted(fact_lines, turn_part, max_tokens, turns_header)[0]


def render_counted(fact_lines: list[str], turn_part: list[tuple[str, str]], max_tokens: int,
                   turns_header: str = TURNS_HEADER) -> tuple[str, int, int]:
    """``render`` plus how many fact lines and turn-part lines it kept (what the prompt really shows)."""
    facts = cap_blocks(fact_lines, max_tokens)
    remaining = max_tokens - sum(estimate_tokens(line) for line in facts)
    turns: list[str] = []
    kinds: list[str] = []
    for kind, line in turn_part:
        cost = estimate_tokens(line)
        if cost > remaining and (facts or turns):
            break
        if kind != "blank":
            line = truncate_to_tokens(line, remaining)
            if not line:
                break
        turns.append(line)
        kinds.append(kind)
        remaining -= estimate_tokens(line)
    while kinds and kinds[-1] in ("date", "blank"):
        kinds.pop()
        turns.pop()
    parts = []
    if facts:
        parts.append(FACTS_HEADER + "\n\n" + "\n".join(facts))
    if turns:
        parts.append(turns_header + "\n\n" + "\n".join(turns))
    return "\n\n".join(parts), len(facts), len(turns)
