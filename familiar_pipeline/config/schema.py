"""The typed, immutable configuration objects of one familiar (character.toml).

Every section is a frozen stdlib dataclass whose fields say, through `knob(...)`
metadata, what values are valid; `validation` derives the pydantic schema from that
metadata, so each rule is written once. They stay plain dataclasses (not pydantic
models) because code and tests build them directly, without validation, and rely on
`dataclasses.asdict` / `replace` and `FrozenInstanceError`; a projector's knob class is
the same kind of dataclass.

The dataclass defaults equal the shipped ``_default/character.toml`` (a test pins
this), so code that builds config objects directly behaves like a loaded default
config.

Secrets never come from TOML: ``DISCORD_TOKEN`` and the API keys named by each LLM
slot's ``api_key_env`` are read from the environment into `Secrets`, whose repr masks
them, and `render_config` only says whether each one is set.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from dataclasses import Field, asdict, dataclass, field, make_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from familiar_pipeline.config import catalogue
from familiar_pipeline.config.knobs import BudgetKnob, knob


# What the `familiar_pipeline.config` facade re-exports. `LAYER_NAMES` and `DEFAULT_BUDGETS` are
# importable too, but computed on first use (module `__getattr__` below): the prompt layers register
# from above, so they are not in `__all__` (a star import would have to discover them).
__all__ = [
    "BUDGET_TIERS", "DEFAULT_FAMILIAR_ID", "DEFAULT_LLM_SLOTS", "DEFAULT_PROJECTORS", "LLM_SLOTS",
    "MESSAGE_RENDERINGS", "BudgetKnob", "ChannelConfig", "ConfigError", "EmbeddingConfig", "FamiliarConfig", "FrozenDict",
    "HistoryConfig", "LlmConfig", "LlmSlotConfig", "MemoryConfig", "PipelineConfig", "RetrievalConfig",
    "SCOPE_HINT", "SCOPE_PATTERN", "ScopesConfig", "PrivacyConfig", "AFTER_FORGET", "Secrets", "TierBudget",
    "budget_class", "default_budgets", "layer_names",
]


class ConfigError(ValueError):
    """A configuration problem, with the file and key it concerns."""


DEFAULT_FAMILIAR_ID = "familiar"


def layer_names() -> tuple[str, ...]:
    """The prompt layers in their default order, most stable first (prompt-cache friendly).

    Each layer declares its place in its own ``LayerSpec`` (the bot's ``prompt/layers/``) and
    registers with `catalogue.register_layer`; this is what ``LAYER_NAMES`` once listed here.
    """
    return catalogue.layer_names()


MESSAGE_RENDERINGS: tuple[str, ...] = ("name_only", "prefixed")
BUDGET_TIERS: tuple[str, ...] = ("background", "text", "voice")
LLM_SLOTS: tuple[str, ...] = ("background", "judge", "reply")

_ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL = re.compile(r"^https?://\S+$")


class FrozenDict(dict):
    """A dict that refuses changes, so frozen config stays frozen.

    Unlike MappingProxyType it pickles, deep-copies and goes through
    `dataclasses.asdict` (Dagster and metadata code do all three).
    """

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("configuration is read-only; build a new one with dataclasses.replace")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))


def embedding_backends() -> tuple[str, ...]:
    return catalogue.embedding_backends()


# The projectors a familiar runs unless its character.toml says otherwise (the shipped
# character.toml lists the same; a test holds the two equal).
DEFAULT_PROJECTORS: tuple[str, ...] = (
    "rolling_summary",
    "rich_note",
    "fact_supersede",
    "people_dossier",
    "reflection",
    "standing_wish",
)


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class EmbeddingConfig:
    backend: str = knob("off", choices=embedding_backends)
    dim: int = knob(256, minimum=8)  # hash backend only
    fastembed_model: str = knob("BAAI/bge-small-en-v1.5", nonempty=True)
    fastembed_cache_dir: str | None = knob(None)
    fastembed_model_path: str | None = knob(None)  # local ONNX folder (env FAMILIAR_FASTEMBED_MODEL_PATH)


@dataclass(frozen=True)
class LlmSlotConfig:
    name: str  # "reply" | "background" | "judge"
    model: str = knob("")  # litellm model string; "" means not configured
    temperature: float = knob(0.7, minimum=0.0, maximum=2.0)
    max_tokens: int = knob(1024, minimum=1)
    timeout_s: float = knob(60.0, above=0.0)
    max_retries: int = knob(2, minimum=0)
    api_base: str | None = knob(None, pattern=_URL, pattern_hint="an http(s):// URL")
    # NAME of the env var holding the key, never the key itself.
    api_key_env: str | None = knob(None, pattern=_ENV_VAR_NAME, hide_bad_value=True,
                                   pattern_hint="the NAME of an environment variable, "
                                   "e.g. \"OPENROUTER_API_KEY\" (never the key itself)")
    cache: bool = knob(False)  # response cache (on for background: rebuilds are free)
    # Ask for the reply's JSON schema (`response_format`) on prompts that have one:
    # "json_schema" (OpenAI, Ollama, vLLM), "json_object" (JSON mode plus the schema, the
    # form llama.cpp's servers constrain by grammar), "off"; "auto" picks by provider
    # (models.llm.schema_mode), never for fakes.
    structured: str = knob("auto", choices=("auto", "json_schema", "json_object", "off"))

    @property
    def configured(self) -> bool:
        return bool(self.model.strip())


DEFAULT_LLM_SLOTS: Mapping[str, LlmSlotConfig] = FrozenDict({
    "reply": LlmSlotConfig(name="reply"),
    # Background work (extraction, summaries) wants consistency over flair, longer
    # JSON replies, patience, and the cache that makes rebuilds free and identical.
    "background": LlmSlotConfig(name="background", temperature=0.3, max_tokens=2048,
                                timeout_s=120.0, cache=True),
    # Only `familiar eval locomo --answer` calls it: a grader must be repeatable (temperature 0,
    # cached) and says one line and a label.
    "judge": LlmSlotConfig(name="judge", temperature=0.0, max_tokens=128, cache=True),
})


@dataclass(frozen=True)
class LlmConfig:
    max_concurrency: int = knob(4, minimum=1)
    slots: Mapping[str, LlmSlotConfig] = field(default_factory=lambda: DEFAULT_LLM_SLOTS)

    def slot(self, name: str) -> LlmSlotConfig:
        try:
            return self.slots[name]
        except KeyError:
            raise ConfigError(
                f"unknown LLM slot {name!r}; valid: {', '.join(sorted(self.slots))}"
            ) from None


@dataclass(frozen=True)
class PipelineConfig:
    sensor_interval_s: int = knob(5, minimum=5)
    max_familiars_per_tick: int = knob(100, minimum=1)
    max_batches_per_run: int = knob(20, minimum=1)
    index_quiet_s: int = knob(30, minimum=0)


@dataclass(frozen=True)
class RetrievalConfig:
    bm25_weight: float = knob(1.0, minimum=0.0)
    recency_weight: float = knob(0.0, minimum=0.0)
    importance_weight: float = knob(0.6, minimum=0.0)
    # 3.0: (cos+1)/2 spans little of [0, 1], so it needs a larger weight than BM25's full
    # min-max range to matter; measured best on LoCoMo (docs/benchmarks.md). Inert while
    # fact embeddings are off.
    embedding_weight: float = knob(3.0, minimum=0.0)
    fact_overfetch: int = knob(4, minimum=1)  # candidates fetched = this x max_rag_facts
    # Turns: BM25 and (when turn_embedding is active) cosine, min-max normalised over
    # the union of each signal's top `turn_candidates`, summed with these weights.
    # 1.0 with context windows: best on held-out LoCoMo conversations (docs/benchmarks.md).
    turn_embedding_weight: float = knob(1.0, minimum=0.0)
    turn_candidates: int = knob(50, minimum=1)
    turn_neighbours: int = knob(2, minimum=0)  # same-channel turns shown before and after each hit
    # Only the best this many hits bring their neighbours; the rest are shown alone (0 = every hit):
    # more distinct hits fit the section's tokens (docs/benchmarks.md).
    turn_neighbour_hits: int = knob(8, minimum=0)
    # Share of a turn's cosine taken from its context window's: the window vector when the
    # turn_window_embedding projector is on, else the mean over the window's turns (itself
    # and its `turn_context_span` nearest same-channel turns each side); 0 = the turn alone.
    turn_context: float = knob(0.5, minimum=0.0, maximum=1.0)
    turn_context_span: int = knob(2, minimum=0)  # query-time blend only; window vectors: their projector's span
    # The nearest-turn search covers the newest this many turn vectors (0 = all); older turns
    # still get their cosine when BM25 finds them. Keeps a reply's cost flat past it.
    turn_vector_search_rows: int = knob(20000, minimum=0)
    # "weighted": the min-max weighted sum above; "rrf": reciprocal rank fusion (k=60), kept to
    # re-check the measurement that chose "weighted" (docs/benchmarks.md).
    turn_fusion: str = knob("weighted", choices=("weighted", "rrf"))
    # Evidence beyond a turn's words, each added to the fused score (whose parts are each in
    # [0, 1]): a cue naming a participant favours their turns (and, by the mention share, turns
    # talking about them; never turns merely addressed to them); a cue naming a time favours the
    # turns said in that window, fading over the slack days after it (a cue asking "when" favours,
    # by the when share, turns with a time expression); a question-like candidate passes the
    # reply credit share of its score to the next turn by someone else in its channel.
    turn_speaker_weight: float = knob(0.5, minimum=0.0)
    turn_mention_share: float = knob(0.5, minimum=0.0, maximum=1.0)
    turn_time_weight: float = knob(1.5, minimum=0.0)
    turn_time_slack_days: float = knob(14.0, minimum=0.0, maximum=366.0)
    turn_when_share: float = knob(0.25, minimum=0.0, maximum=1.0)
    turn_reply_credit: float = knob(0.8, minimum=0.0, maximum=1.0)
    # Substance (prompt/retrieval/substance.py): the best `turn_substance_depth` candidates are re-ordered
    # by total / best total + length x ln(1 + content tokens) - question x [a question mark], so a
    # named person's "Thanks, Mel!" no longer fills the top; 0 depth (or both weights 0) = off.
    # A pairwise fit on LoCoMo chose the two terms; the values won the tune-on-two rotation
    # (docs/benchmarks.md, "Substance").
    turn_substance_length: float = knob(0.2, minimum=0.0)
    turn_substance_question: float = knob(0.05, minimum=0.0)
    turn_substance_depth: int = knob(64, minimum=0)
    # Spread over days (issue 33), only for cues that ask for an order or every time (not a
    # plain list; prompt/retrieval/spread.py): the best candidates are re-picked, each losing this much
    # per better one already taken from its channel and local day (0 = off); the first
    # `turn_day_spread_keep` stay where they are (docs/benchmarks.md, "Updates, wishes and order").
    turn_day_spread: float = knob(0.6, minimum=0.0)
    turn_day_spread_keep: int = knob(4, minimum=0)
    # The newer word wins (issue 33; prompt/retrieval/threads.py), only for questions about how things
    # stand now ("when is the demo?"): each of the best `turn_thread_hits` hits is followed to
    # every later candidate by the same person that says a word of change ("moved", "instead",
    # "now") with a blended cosine of at least `turn_thread_similarity` to it; those rank just
    # above it, newest first (0 hits = off).
    turn_thread_hits: int = knob(10, minimum=0)
    turn_thread_similarity: float = knob(0.3, minimum=-1.0, maximum=1.0)
    # Both genres (issue 48; prompt/retrieval/genre.py): "auto" reads from the scope's own newest turns
    # whether people talk among themselves or a person talks with the familiar (its replies a
    # quarter of the turns or more, and long); "people" / "familiar" force one (for measuring).
    # In the familiar genre its own replies' fused total is multiplied by `turn_familiar_weight`
    # (what the person said is the better evidence of what they said, prefer or changed) and
    # substance's re-order, learned among people, is off (it lifted every long reply).
    turn_genre: str = knob("auto", choices=("auto", "people", "familiar"))
    turn_familiar_weight: float = knob(0.75, minimum=0.0, maximum=1.0)
    # In the familiar genre, a message asking its advice ("can you suggest...", "what do you
    # think?") favours the person's turns that tell their taste or situation ("I prefer...",
    # "I'm interested in...") by this share of a perfect text match (0 = off).
    turn_taste_weight: float = knob(0.3, minimum=0.0)
    # A shown turn longer than this many characters is shown as its passage that best matches
    # the cue (about this long, cut at line or sentence ends), with its time and speaker, not
    # whole: a long reply no longer fills the section (0 = always whole).
    turn_passage_chars: int = knob(600, minimum=0)
    # When "turn_passage_embedding" is among the projectors, a long turn's cosine becomes the
    # larger of its own (window-blended) cosine and this x its best passage's: evidence deep
    # in a long reply is found by the passage that holds it (0 = passage vectors unused). A
    # 600-character passage matches a cue more closely than a whole reply does, so a plain max
    # (1.0) lifted long replies over short turns; 0.9 measured best of 0.8-1.0 on lme-dev
    # (docs/benchmarks.md, "Passage vectors").
    turn_passage_weight: float = knob(0.9, minimum=0.0, maximum=2.0)


# A scope string a reply or a row can carry (see familiar_pipeline.storage.scopes); "familiar"
# is the scope of rows built across scopes or before scopes existed.
SCOPE_PATTERN = re.compile(r"^(?:(?:guild|channel):[1-9][0-9]{0,19}|familiar)$")
SCOPE_HINT = 'a scope such as "guild:123456789", "channel:123456789" or "familiar"'


@dataclass(frozen=True)
class ScopesConfig:
    """``[memory.scopes]``: which scopes a reply may read besides its own (default: none).

    ``groups`` maps a name to scopes that see one another's memory (every member reads
    every member's rows). Listing ``familiar`` in a group lets its members read the rows
    built across scopes or before scopes existed. The default is strict: a reply reads
    its own scope only. ``dm_sees_person`` joins a DM to what its person said elsewhere.
    """

    groups: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: FrozenDict({}))
    # A DM (a conversation outside any server with one person) also reads what that person
    # said in any scope: their own turns, and facts resting on their turns alone.
    dm_sees_person: bool = False

    def visible(self, scope: str) -> tuple[str, ...]:
        """The scopes a reply said in ``scope`` reads: its own first, then its groups' members, sorted."""
        joined = {member for members in self.groups.values() if scope in members for member in members}
        joined.discard(scope)
        return (scope, *sorted(joined))


AFTER_FORGET = ("opt_out", "new")


@dataclass(frozen=True)
class PrivacyConfig:
    """``[memory.privacy]``: how long deleted messages and edits' earlier texts are kept, and what a forgotten
    person's later messages do (docs/privacy.md)."""

    # A message deleted on Discord (or in an import) has its text purged once memory has followed
    # the deletion and it was deleted this many hours ago: 0 purges it at the next run. An audit
    # window is the operator's choice, never the default.
    deleted_retention_hours: float = knob(0.0, minimum=0.0)
    # An edited message's earlier text (what it read before the edit) is purged from the turn log's
    # change history, and from every file that was derived from it, once memory has followed the
    # edit and it was edited this many hours ago: 0 purges it at the next run.
    edited_retention_hours: float = knob(0.0, minimum=0.0)
    # A person forgotten with `familiar forget --person` or `/forget everything`, who writes again:
    # "opt_out" answers them but never projects their messages (and purges their text like a
    # deleted message's); "new" remembers them again from that message on, as someone new.
    after_forget: str = knob("opt_out", choices=AFTER_FORGET)


@dataclass(frozen=True)
class MemoryConfig:
    projectors: tuple[str, ...] = DEFAULT_PROJECTORS
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    scopes: ScopesConfig = field(default_factory=ScopesConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    # [providers.memory.<name>] by projector name: the knob dataclass its registered spec declares,
    # or, for a projector registered without knobs, its table as written (untyped).
    tables: Mapping[str, Any] = field(default_factory=lambda: FrozenDict(catalogue.default_knobs()))

    def __getattr__(self, name: str) -> Any:
        """`memory.rich_note` is the knobs of the projector named rich_note."""
        tables = self.__dict__.get("tables")
        if tables is not None and name in tables:
            return tables[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def is_active(self, projector: str) -> bool:
        return projector in self.projectors

    def knobs(self, projector: str) -> Any:
        """The knob dataclass (or untyped mapping) of a projector."""
        if projector in self.tables:
            return self.tables[projector]
        catalogue.knob_class(projector)  # raises with the valid names if unknown
        return FrozenDict({})


class TierBudget:
    """Token caps per prompt section, for one budget tier (``[budget.<tier>]``).

    Its fields are the keys the registered prompt layers declare (``LayerSpec.budget``, a
    `BudgetKnob` each: ``wishes_tokens`` is the ``standing_wishes`` layer's), in stack order:
    the class is made from those declarations (`budget_class`) once they registered, so a new
    layer's key needs no line here. ``TierBudget(...)`` makes one of that class; its
    defaults are the voice tier's (`default_budgets` holds every tier's). A frozen dataclass
    like the other sections (``dataclasses.replace``, ``asdict`` and ``fields`` work), whose
    fields a type checker sees as ints.
    """

    if TYPE_CHECKING:  # the fields are made at run time (`budget_class`)
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

        def __init__(self, **knobs: int) -> None: ...

        def __getattr__(self, name: str) -> int: ...

    _declared: ClassVar[tuple[BudgetKnob, ...]] = ()

    def __new__(cls, *args: Any, **knobs: Any) -> TierBudget:
        return object.__new__(budget_class() if cls is TierBudget else cls)

    @property
    def total_tokens(self) -> int:
        """Sum of the section caps: a bound for reporting, not a cap of its own."""
        return sum(getattr(self, k.name) for k in self._declared if k.tokens)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_tier_budget, (asdict(self),))


def _tier_budget(knobs: dict[str, int]) -> TierBudget:
    """Unpickle a `TierBudget` (its class is made at run time, so it is rebuilt by its values)."""
    return TierBudget(**knobs)


@functools.lru_cache(maxsize=16)
def _budget_class(declared: tuple[BudgetKnob, ...]) -> type[TierBudget]:
    fields_ = [(k.name, int, knob(k.voice, minimum=k.minimum)) for k in declared]
    cls = make_dataclass("TierBudget", fields_, bases=(TierBudget,), frozen=True,
                         namespace={"_declared": declared, "__doc__": TierBudget.__doc__})
    cls.__module__ = __name__
    return cls


def budget_class() -> type[TierBudget]:
    """The `TierBudget` dataclass of the registered layers' budget keys (one class per set of them)."""
    return _budget_class(catalogue.budget_knobs())


@functools.lru_cache(maxsize=16)
def _default_budgets(declared: tuple[BudgetKnob, ...]) -> Mapping[str, TierBudget]:
    cls = _budget_class(declared)
    return FrozenDict({tier: cls(**{k.name: k.default(tier) for k in declared})
                       for tier in ("voice", "text", "background")})


def default_budgets() -> Mapping[str, TierBudget]:
    """Each tier's budget with every layer's declared default for it (once `DEFAULT_BUDGETS`)."""
    return _default_budgets(catalogue.budget_knobs())


@dataclass(frozen=True)
class HistoryConfig:
    voice_window_size: int = knob(100, minimum=1)
    text_window_size: int = knob(200, minimum=1)
    coalesce_max_gap_seconds: float = knob(8.0, minimum=0.0)
    text_silence_gap_fold_seconds: float = knob(0.0, minimum=0.0)


@dataclass(frozen=True)
class ChannelConfig:
    """Per-channel overrides; a channel without a table gets these defaults."""

    channel_id: int
    prompt_layers: tuple[str, ...] = knob(default_factory=layer_names, choices=layer_names)
    history_window_size: int | None = knob(None, minimum=1)  # None: the tier's window
    message_rendering: str = knob("prefixed", choices=MESSAGE_RENDERINGS)
    respond_to_all: bool = knob(False)


class Secrets:
    """Secrets read from the environment; immutable, and no repr shows a value.

    Deliberately not a dataclass: `dataclasses.asdict(config)` (handy for run
    metadata) then keeps this object whole, masked, instead of copying the token
    out into a plain dict.
    """

    __slots__ = ("_discord_token", "_api_keys")
    _discord_token: str | None
    _api_keys: Mapping[str, str]  # a FrozenDict

    def __init__(self, discord_token: str | None = None, api_keys: Mapping[str, str] | None = None):
        object.__setattr__(self, "_discord_token", discord_token or None)
        # Values of the env vars that LLM slots name in api_key_env (only those).
        object.__setattr__(self, "_api_keys", FrozenDict(api_keys or {}))

    @property
    def discord_token(self) -> str | None:
        return self._discord_token

    @property
    def api_keys(self) -> Mapping[str, str]:
        return self._api_keys

    def api_key_for(self, slot: LlmSlotConfig) -> str | None:
        """The key for `slot`, or None (then litellm looks up its provider's usual variable)."""
        if not slot.api_key_env:
            return None
        return self._api_keys.get(slot.api_key_env) or None

    def is_set(self, env_name: str) -> bool:
        return bool(self._api_keys.get(env_name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Secrets are read-only")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secrets):
            return NotImplemented
        return (self._discord_token, self._api_keys) == (other._discord_token, other._api_keys)

    def __hash__(self) -> int:
        return hash((self._discord_token, self._api_keys))

    def __reduce__(self) -> tuple:
        return (Secrets, (self._discord_token, dict(self._api_keys)))

    def __repr__(self) -> str:
        token = "***set***" if self._discord_token else "(unset)"
        keys = ", ".join(f"{name}={'***set***' if value else '(unset)'}"
                         for name, value in sorted(self._api_keys.items()))
        return f"Secrets(discord_token={token}, api_keys=[{keys}])"

    __str__ = __repr__


@dataclass(frozen=True)
class FamiliarConfig:
    familiar_id: str = DEFAULT_FAMILIAR_ID
    display_name: str = ""  # "" means: first alias, else familiar_id.title()
    aliases: tuple[str, ...] = ()
    display_tz: str = "UTC"
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    budgets: Mapping[str, TierBudget] = field(default_factory=default_budgets)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    channels: Mapping[int, ChannelConfig] = field(default_factory=lambda: FrozenDict({}))
    llm: LlmConfig = field(default_factory=LlmConfig)
    secrets: Secrets = field(default_factory=Secrets)
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.display_name:
            name = self.aliases[0] if self.aliases else self.familiar_id.title()
            object.__setattr__(self, "display_name", name)

    def budget_for(self, tier: str) -> TierBudget:
        try:
            return self.budgets[tier]
        except KeyError:
            raise ConfigError(
                f"unknown budget tier {tier!r}; valid tiers: {', '.join(BUDGET_TIERS)}"
            ) from None

    def channel(self, channel_id: int) -> ChannelConfig:
        """The channel's overrides, or the defaults when it has no table."""
        return self.channels.get(int(channel_id)) or ChannelConfig(channel_id=int(channel_id))

    @property
    def tz(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.display_tz)


def __getattr__(name: str) -> Any:
    """``LAYER_NAMES`` and ``DEFAULT_BUDGETS``, the names these had when config listed the layers:
    computed from the registered layers on use (`layer_names`, `default_budgets`)."""
    if name == "LAYER_NAMES":
        return layer_names()
    if name == "DEFAULT_BUDGETS":
        return default_budgets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
