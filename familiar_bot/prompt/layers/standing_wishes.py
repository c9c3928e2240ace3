"""``standing_wishes``: what the person speaking asked the familiar to keep doing, in every reply.

A wish ("from now on keep answers short", "call me Sam", "never bring up my ex") shares no
words with the later messages it should shape, so retrieval would not find it; this
section pins the speaker's current wishes instead (the `standing_wish` projector keeps
them, one current per point: a newer wish on a point retired the older). It sits right
after the operating mode: it changes only when the speaker or their wishes do.

Only the speaker's wishes (the author of the channel's newest user turn: the responder
writes the message before assembling), only from the reply's visible scopes
(:mod:`familiar_bot.prompt.scoping`), newest first, one per point (the newest, when joined
scopes each hold one), under ``[budget.<tier>] wishes_tokens``: the oldest go first past it.
Nothing at all when the speaker has none, so a conversation without wishes pays nothing.

The debug block (``prompt.debug["wishes"]``) lists the wish ids and turn ids shown and the
tokens spent: what ``/context`` shows and what a benchmark counts as "wish in the prompt".
Wish texts are people's words: collapsed to one line, so none can start a header line.

``/memory`` lists the person's current wishes where they ask, each with the message that said
it, and ``/memory export`` holds every wish of theirs held there, retired ones too (``SPEC.held``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from familiar_pipeline.projectors.wishes.tables import CURRENT, StandingWish, WishView, wishes_of

from familiar_bot.prompt.layers.common import local_date, one_line
from familiar_bot.prompt.layers.spec import BudgetKnob, HeldPart, LayerSpec
from familiar_bot.prompt.scoping import scope_key, visible_scopes
from familiar_bot.prompt.tokens import estimate_tokens
from familiar_bot.sources import Source, iso, turn_sources

if TYPE_CHECKING:
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_bot.prompt.types import AssemblyContext

SPEAKER_WINDOW = 20  # the channel's newest turns searched for the speaker


def speaker_key(ctx: AssemblyContext, memory: MemoryView) -> str | None:
    """The person being answered: the author of the channel's newest user turn; None if there is none."""
    if ctx.channel_id is None:
        return None
    for turn in reversed(memory.channel_window(ctx.channel_id, SPEAKER_WINDOW)):
        if turn.role == "user" and turn.author_key:
            return turn.author_key
    return None


def one_per_point(wishes: list[StandingWish]) -> list[StandingWish]:
    """The newest wish of each point, newest first (``wishes`` is newest first)."""
    seen: set[str] = set()
    out = []
    for wish in wishes:
        if wish.point not in seen:
            seen.add(wish.point)
            out.append(wish)
    return out


def render(name: str, wishes: list[StandingWish], max_tokens: int, tz: Any) -> tuple[str, list[StandingWish]]:
    """The section and the wishes it shows: newest first, while they fit in ``max_tokens``."""
    head = (f"## Standing wishes of {name}\n"
            f"{name} asked you to keep to these until they say otherwise (their words, newest first):")
    used = estimate_tokens(head)
    lines, shown = [], []
    for wish in wishes:
        line = f"- ({local_date(wish.valid_from, tz)}) {one_line(wish.text)}"
        cost = estimate_tokens("\n" + line)
        if used + cost > max_tokens:
            break  # newest first: what is left out is older
        used += cost
        lines.append(line)
        shown.append(wish)
    if not shown:
        return "", []
    return "\n".join([head, *lines]), shown


class StandingWishesLayer:
    name = "standing_wishes"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        budget = memory.config.budget_for(ctx.tier)
        return (f"p{speaker_key(ctx, memory)}|g{ctx.guild_id}|{scope_key(ctx, memory)}|s{memory.snapshot.version}"
                f"|cap{budget.wishes_tokens}")

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return self.build_with_debug(ctx, memory)[0]

    def build_with_debug(self, ctx: AssemblyContext, memory: MemoryView) -> tuple[str, dict[str, Any]]:
        debug: dict[str, Any] = {"wish_ids": [], "turn_ids": [], "tokens": 0}
        person = speaker_key(ctx, memory)
        if person is None:
            return "", debug
        visible = visible_scopes(ctx, memory)
        everywhere = wishes_of(memory.snapshot, person, None)
        wishes = [w for w in everywhere if w.scope in visible]
        if len(everywhere) > len(wishes):  # counted in /context's scope report only when some were left out
            debug["scope_excluded"] = len(everywhere) - len(wishes)
        if not wishes:
            return "", debug
        name = memory.labels(ctx.guild_id)(person)
        text, shown = render(name, one_per_point(wishes), memory.config.budget_for(ctx.tier).wishes_tokens,
                             memory.config.tz)
        debug.update(wish_ids=[w.id for w in shown], turn_ids=sorted({t for w in shown for t in w.source_turn_ids}),
                     tokens=estimate_tokens(text), left_out=len(one_per_point(wishes)) - len(shown))
        return text, debug


# --------------------------------------------------------------------------- /memory


@dataclass(frozen=True)
class HeldWish:
    wish: StandingWish
    sources: tuple[Source, ...]

    def as_json(self) -> dict[str, Any]:
        w = self.wish
        return {"id": w.id, "text": w.text, "point": w.point, "scope": w.scope, "said_at": iso(w.valid_from),
                "current": w.current, "retired_at": iso(w.retired_at), "retired_by": w.retired_by,
                "source_message_ids": [s.message_id for s in self.sources if s.message_id],
                "source_turn_ids": list(w.source_turn_ids)}


def wishes_here(memory: MemoryView, person: str, visible: tuple[str, ...], *,
                view: WishView = CURRENT) -> list[HeldWish]:
    """The person's standing wishes in ``visible`` (the current ones unless ``view`` says every row),
    newest first, with the messages that said them."""
    rows = wishes_of(memory.snapshot, person, visible, view)
    sources = turn_sources(memory.turn_log, sorted({t for w in rows for t in w.source_turn_ids}))
    return [HeldWish(w, tuple(sources[t] for t in w.source_turn_ids)) for w in rows]


def _held(memory: MemoryView, person: str, visible: tuple[str, ...]) -> tuple[HeldWish, ...]:
    return tuple(wishes_here(memory, person, visible))


def _lines(wishes: tuple[HeldWish, ...]) -> list[str]:
    if not wishes:
        return []
    return [f"What you asked me to keep doing ({len(wishes)}):",
            *(f"- {one_line(w.wish.text)} [{' '.join(s.render() for s in w.sources)}]" for w in wishes)]


def _export(memory: MemoryView, person: str, visible: tuple[str, ...]) -> list[dict[str, Any]]:
    return [w.as_json() for w in wishes_here(memory, person, visible, view=WishView(include_retired=True))]


SPEC = LayerSpec(
    name="standing_wishes",
    layer=StandingWishesLayer,
    position=300,  # right after the operating mode: it changes only when the speaker or their wishes do
    debug_key="wishes",
    scoped=True,
    # In every reply to someone who has any (0 tokens for everyone else). At 120 a person with 16
    # wishes saw about half of them (benchmarks/updates.py, docs/benchmarks.md).
    budget=(BudgetKnob("wishes_tokens", voice=240, text=400, background=400),),
    held=HeldPart("wishes", held=_held, lines=_lines, export=_export),
)
