"""Typed, immutable configuration of one familiar (character.toml).

Loading order, later wins:

1. ``_default/character.toml`` (``paths.default_dir``): every knob, commented;
2. the familiar's own ``data/familiars/<id>/character.toml``, deep-merged (tables
   merge key by key; scalars and lists replace whole, so a ``projectors`` list
   replaces the default list);
3. environment overrides: ``FAMILIAR__SECTION__SUB__KEY=<TOML literal>`` for any
   knob, plus ``FAMILIAR_FASTEMBED_MODEL_PATH``.

The merged tree is validated once, into frozen dataclasses. Every leaf remembers
which file or environment variable set it, so an error names the source that
actually holds the bad value, plus the dotted key, the value and what is valid.
Unknown keys are errors everywhere: a misspelt knob that silently does nothing
is worse than a refusal to start.

The dataclass defaults equal the shipped ``_default/character.toml`` (a test
pins this), so code that builds config objects directly behaves like a loaded
default config.

Secrets never come from TOML: ``DISCORD_TOKEN`` and the API keys named by each
LLM slot's ``api_key_env`` are read from the environment into `Secrets`, whose
repr masks them, and `render_config` only says whether each one is set.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import tomllib
import zoneinfo
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, get_type_hints

from familiar_pipeline.storage import paths

from familiar_pipeline.projectors import registry


class ConfigError(ValueError):
    """A configuration problem, with the file and key it concerns."""


DEFAULT_FAMILIAR_ID = "familiar"
ENV_PREFIX = "FAMILIAR__"

# Prompt layers in their default order, most stable first (prompt-cache friendly).
LAYER_NAMES: tuple[str, ...] = (
    "character_card",
    "operating_mode",
    "lorebook",
    "conversation_summary",
    "reflection",
    "people_dossier",
    "rag_context",
    "recent_history",
)
MESSAGE_RENDERINGS: tuple[str, ...] = ("name_only", "prefixed")
BUDGET_TIERS: tuple[str, ...] = ("background", "text", "voice")
LLM_SLOTS: tuple[str, ...] = ("background", "reply")

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


def knob(default: Any, *, minimum: float | None = None, maximum: float | None = None,
         above: float | None = None, choices: Any = None, nonempty: bool = False,
         pattern: re.Pattern[str] | None = None, pattern_hint: str = "",
         hide_bad_value: bool = False) -> Any:
    """A dataclass field whose metadata says what values are valid.

    `above` is an exclusive lower bound; `choices` is a tuple or a zero-argument
    callable (for registries that grow at import time); `hide_bad_value` keeps a
    rejected value out of error messages (it may be a pasted secret).
    """
    meta = {"minimum": minimum, "maximum": maximum, "above": above, "choices": choices,
            "nonempty": nonempty, "pattern": pattern, "pattern_hint": pattern_hint,
            "hide_bad_value": hide_bad_value}
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class EmbeddingConfig:
    backend: str = knob("off", choices=lambda: _embedding_backends())
    dim: int = knob(256, minimum=8)  # hash backend only
    fastembed_model: str = knob("BAAI/bge-small-en-v1.5", nonempty=True)
    fastembed_cache_dir: str | None = knob(None)
    fastembed_model_path: str | None = knob(None)  # local ONNX folder (env FAMILIAR_FASTEMBED_MODEL_PATH)


@dataclass(frozen=True)
class LlmSlotConfig:
    name: str  # "reply" | "background"
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
    max_familiars_per_tick: int = knob(20, minimum=1)
    max_batches_per_run: int = knob(20, minimum=1)
    index_quiet_s: int = knob(30, minimum=0)


@dataclass(frozen=True)
class RollingSummaryConfig:
    turns_threshold: int = knob(10, minimum=1)
    backfill_cap: int = knob(200, minimum=1)


@dataclass(frozen=True)
class RichNoteConfig:
    batch_size: int = knob(10, minimum=1)
    participants_max: int = knob(30, minimum=1)


@dataclass(frozen=True)
class PeopleDossierConfig:
    max_facts_per_prompt: int = knob(50, minimum=1)
    # Fold every N extraction batches: one fold per touched person per batch cost 20 calls per 100 turns.
    batches_per_fold: int = knob(3, minimum=1)


@dataclass(frozen=True)
class ReflectionConfig:
    turns_threshold: int = knob(20, minimum=1)
    max_reflections_per_tick: int = knob(3, minimum=1)
    max_turns_per_tick: int = knob(50, minimum=1)
    recent_facts_limit: int = knob(20, minimum=0)  # 0 leaves facts out of the prompt


@dataclass(frozen=True)
class FactSupersedeConfig:
    priors_max: int = knob(20, minimum=1)
    # Most new facts about one person, from one extraction batch, judged in one call (one call
    # per fact cost 68 calls per 100 turns).
    new_facts_per_call: int = knob(15, minimum=1)


@dataclass(frozen=True)
class FactEmbeddingConfig:
    batch_size: int = knob(32, minimum=1)


@dataclass(frozen=True)
class TurnEmbeddingConfig:
    batch_size: int = knob(64, minimum=1)


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
    turn_embedding_weight: float = knob(1.0, minimum=0.0)
    turn_candidates: int = knob(20, minimum=1)
    turn_neighbours: int = knob(1, minimum=0)  # same-channel turns shown before and after each hit
    # "weighted": the min-max weighted sum above; "rrf": reciprocal rank fusion (k=60), kept to
    # re-check the measurement that chose "weighted" (docs/benchmarks.md).
    turn_fusion: str = knob("weighted", choices=("weighted", "rrf"))


# The built-in knob tables under [providers.memory.<name>], by projector name.
KNOB_TABLES: Mapping[str, type] = FrozenDict({
    "rolling_summary": RollingSummaryConfig,
    "rich_note": RichNoteConfig,
    "fact_supersede": FactSupersedeConfig,
    "people_dossier": PeopleDossierConfig,
    "reflection": ReflectionConfig,
    "fact_embedding": FactEmbeddingConfig,
    "turn_embedding": TurnEmbeddingConfig,
})


@dataclass(frozen=True)
class MemoryConfig:
    projectors: tuple[str, ...] = registry.DEFAULT_PROJECTORS
    rolling_summary: RollingSummaryConfig = field(default_factory=RollingSummaryConfig)
    rich_note: RichNoteConfig = field(default_factory=RichNoteConfig)
    people_dossier: PeopleDossierConfig = field(default_factory=PeopleDossierConfig)
    reflection: ReflectionConfig = field(default_factory=ReflectionConfig)
    fact_supersede: FactSupersedeConfig = field(default_factory=FactSupersedeConfig)
    fact_embedding: FactEmbeddingConfig = field(default_factory=FactEmbeddingConfig)
    turn_embedding: TurnEmbeddingConfig = field(default_factory=TurnEmbeddingConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    # [providers.memory.<name>] tables of registered third-party projectors, untyped.
    extra_knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: FrozenDict({}))

    def is_active(self, projector: str) -> bool:
        return projector in self.projectors

    def knobs(self, projector: str) -> Any:
        """The knob dataclass (built-in) or mapping (third-party) of a projector."""
        if projector in KNOB_TABLES:
            return getattr(self, projector)
        if projector in self.extra_knobs:
            return self.extra_knobs[projector]
        registry.get_projector(projector)  # raises with the valid names if unknown
        return FrozenDict({})


@dataclass(frozen=True)
class TierBudget:
    """Token caps per prompt section; the dataclass defaults are the voice tier."""

    recent_history_tokens: int = knob(3000, minimum=1)
    rag_tokens: int = knob(900, minimum=1)
    dossier_tokens: int = knob(900, minimum=1)
    summary_tokens: int = knob(600, minimum=1)
    reflection_tokens: int = knob(600, minimum=1)
    lorebook_tokens: int = knob(600, minimum=1)
    max_history_turns: int = knob(200, minimum=1)
    max_rag_turns: int = knob(10, minimum=1)
    max_rag_facts: int = knob(6, minimum=1)
    max_dossier_people: int = knob(16, minimum=1)
    max_reflections: int = knob(6, minimum=1)
    max_lorebook_entries: int = knob(12, minimum=1)

    @property
    def total_tokens(self) -> int:
        """Sum of the section caps: a bound for reporting, not a cap of its own."""
        return (self.recent_history_tokens + self.rag_tokens + self.dossier_tokens
                + self.summary_tokens + self.reflection_tokens + self.lorebook_tokens)


DEFAULT_BUDGETS: Mapping[str, TierBudget] = FrozenDict({
    "voice": TierBudget(),
    "text": TierBudget(
        recent_history_tokens=8000, rag_tokens=2400, dossier_tokens=2400, summary_tokens=1600,
        reflection_tokens=1600, lorebook_tokens=1600, max_history_turns=400, max_rag_turns=16,
        max_rag_facts=10, max_dossier_people=24, max_reflections=10, max_lorebook_entries=20,
    ),
    "background": TierBudget(
        recent_history_tokens=24000, rag_tokens=8000, dossier_tokens=8000, summary_tokens=4000,
        reflection_tokens=4000, lorebook_tokens=4000, max_history_turns=1000, max_rag_turns=24,
        max_rag_facts=16, max_dossier_people=32, max_reflections=16, max_lorebook_entries=32,
    ),
})


@dataclass(frozen=True)
class HistoryConfig:
    voice_window_size: int = knob(100, minimum=1)
    text_window_size: int = knob(200, minimum=1)
    coalesce_max_gap_seconds: float = knob(45.0, minimum=0.0)
    text_silence_gap_fold_seconds: float = knob(0.0, minimum=0.0)


@dataclass(frozen=True)
class ChannelConfig:
    """Per-channel overrides; a channel without a table gets these defaults."""

    channel_id: int
    prompt_layers: tuple[str, ...] = knob(LAYER_NAMES, choices=LAYER_NAMES)
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
    budgets: Mapping[str, TierBudget] = field(default_factory=lambda: DEFAULT_BUDGETS)
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


# --------------------------------------------------------------------------- merge with origins


class _Tree:
    """The merged TOML tree plus, per key path, the source that last set it."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.origins: dict[tuple[str, ...], str] = {}
        self.sources: list[str] = []

    def merge(self, table: Mapping[str, Any], source: str) -> None:
        self.sources.append(source)
        self._merge_into(self.data, table, source, ())

    def _merge_into(self, dst: dict, src: Mapping[str, Any], source: str, prefix: tuple[str, ...]) -> None:
        for key, value in src.items():
            path = prefix + (key,)
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                self._merge_into(dst[key], value, source, path)
                continue
            for stale in [p for p in self.origins if p[: len(path)] == path]:
                del self.origins[stale]
            dst[key] = copy.deepcopy(value)
            self.origins[path] = source

    def source_of(self, path: tuple[str, ...]) -> str:
        for end in range(len(path), 0, -1):
            if path[:end] in self.origins:
                return self.origins[path[:end]]
        return self.sources[0] if self.sources else "configuration"


# --------------------------------------------------------------------------- messages


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(segment: str) -> str:
    return segment if _BARE_KEY.fullmatch(segment) else json.dumps(segment, ensure_ascii=False)


def dotted(path: tuple[str, ...]) -> str:
    """('providers','memory','rich_note','batch_size') -> '[providers.memory.rich_note].batch_size'."""
    if len(path) == 1:
        return _key(path[0])
    return f"[{'.'.join(_key(p) for p in path[:-1])}].{_key(path[-1])}"


def _table_name(path: tuple[str, ...]) -> str:
    return f"[{'.'.join(_key(p) for p in path)}]" if path else "the top level"


def toml_value(value: Any) -> str:
    """A value as TOML text (used in messages and by `render_config`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _shown(value: Any) -> str:
    text = toml_value(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Validator:
    """Turns the merged tree into dataclasses; every error names its source."""

    def __init__(self, tree: _Tree) -> None:
        self.tree = tree

    def bad(self, path: tuple[str, ...], value: Any, expected: str, *,
            wrong_type: bool = False, hide: bool = False) -> ConfigError:
        shown = "(value hidden: it may be a secret)" if hide else _shown(value)
        got = f", got {_kind(value)}" if wrong_type else ""
        return ConfigError(
            f"{self.tree.source_of(path)}: {dotted(path)} = {shown} is invalid: expected {expected}{got}"
        )

    def unknown(self, table: Mapping[str, Any], valid: tuple[str, ...] | list[str],
                path: tuple[str, ...], what: str = "key") -> None:
        for key in table:
            if key in valid:
                continue
            hint = difflib.get_close_matches(key, list(valid), n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            options = ", ".join(sorted(valid)) or "(none)"
            raise ConfigError(
                f"{self.tree.source_of(path + (key,))}: unknown {what} {key!r} in "
                f"{_table_name(path)}; valid: {options}{did_you_mean}"
            )

    def table(self, value: Any, path: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ConfigError(
                f"{self.tree.source_of(path)}: {dotted(path)} = {_shown(value)} is invalid: "
                f"expected a table {_table_name(path)}, got {_kind(value)}"
            )
        return value

    def section(self, cls: type, value: Any, path: tuple[str, ...], base: Any = None,
                exclude: tuple[str, ...] = ()) -> Any:
        """Validate a table against a knob dataclass; missing keys keep `base`'s values."""
        table = self.table(value, path)
        specs = {f.name: f for f in fields(cls) if f.name not in exclude}
        self.unknown(table, tuple(specs), path)
        hints = get_type_hints(cls)
        values = {key: self.leaf(raw, hints[key], specs[key].metadata, path + (key,))
                  for key, raw in table.items()}
        return replace(base if base is not None else cls(), **values)

    def leaf(self, value: Any, hint: Any, meta: Mapping[str, Any], path: tuple[str, ...]) -> Any:
        optional = hint in (str | None, int | None)
        if optional:
            hint = str if hint == (str | None) else int
        if hint is bool:
            if not isinstance(value, bool):
                raise self.bad(path, value, "true or false", wrong_type=True)
            return value
        if hint is int:
            if optional and value == "":
                return None
            expected = "an integer" + _bounds(meta)
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.bad(path, value, expected, wrong_type=True)
            if not _in_bounds(value, meta):
                raise self.bad(path, value, expected)
            return value
        if hint is float:
            expected = "a number" + _bounds(meta)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.bad(path, value, expected, wrong_type=True)
            if not math.isfinite(value) or not _in_bounds(value, meta):
                raise self.bad(path, value, expected)
            return float(value)
        if hint is str:
            return self.string(value, meta, path, optional)
        if hint == tuple[str, ...]:
            choices = _choices(meta)
            expected = "an array of strings" + (f" from: {', '.join(choices)}" if choices else "")
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise self.bad(path, value, expected, wrong_type=not isinstance(value, list))
            for item in value:
                if choices and item not in choices:
                    raise ConfigError(
                        f"{self.tree.source_of(path)}: {dotted(path)} = {_shown(value)} is invalid: "
                        f"unknown name {item!r}; valid: {', '.join(choices)}"
                    )
            duplicates = sorted({v for v in value if value.count(v) > 1})
            if duplicates:
                raise ConfigError(
                    f"{self.tree.source_of(path)}: {dotted(path)} = {_shown(value)} is invalid: "
                    f"{', '.join(repr(d) for d in duplicates)} listed more than once"
                )
            return tuple(value)
        raise TypeError(f"no validator for {hint!r} at {dotted(path)}")  # a bug in this module

    def string(self, value: Any, meta: Mapping[str, Any], path: tuple[str, ...], optional: bool) -> str | None:
        hide = bool(meta.get("hide_bad_value"))
        choices = _choices(meta)
        if choices:
            expected = f"one of: {', '.join(toml_value(c) for c in choices)}"
        elif meta.get("pattern_hint"):
            expected = str(meta["pattern_hint"]) + (' (or "" for none)' if optional else "")
        else:
            expected = "a non-empty string" if meta.get("nonempty") else "a string"
        if not isinstance(value, str):
            raise self.bad(path, value, expected, wrong_type=True)
        if optional and value.strip() == "":
            return None
        if meta.get("nonempty") and not value.strip():
            raise self.bad(path, value, expected)
        if choices and value not in choices:
            raise self.bad(path, value, expected)
        pattern = meta.get("pattern")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.bad(path, value, expected, hide=hide)
        return value


def _choices(meta: Mapping[str, Any]) -> tuple[str, ...]:
    choices = meta.get("choices")
    if callable(choices):
        choices = choices()
    return tuple(choices or ())


def _bounds(meta: Mapping[str, Any]) -> str:
    low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    if low is not None and high is not None:
        return f" from {low} to {high}"
    if above is not None:
        return f" > {above}"
    if low is not None:
        return f" >= {low}"
    return ""


def _in_bounds(value: float, meta: Mapping[str, Any]) -> bool:
    low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    return ((low is None or value >= low) and (high is None or value <= high)
            and (above is None or value > above))


# --------------------------------------------------------------------------- validation


_TOP_KEYS = ("aliases", "display_tz", "pipeline", "providers", "memory", "budget", "llm", "channels")
_PROVIDER_KEYS = ("memory", "embedding", "history")
_LEGACY_HINTS = {
    ("providers", "history", "window_size"):
        "it was split into voice_window_size and text_window_size",
}


def _build(tree: _Tree, familiar_id: str, secrets_env: Mapping[str, str]) -> FamiliarConfig:
    v = _Validator(tree)
    root = tree.data
    _reject_legacy(tree, root)
    v.unknown(root, _TOP_KEYS, ())

    aliases = _aliases(v, root.get("aliases", []))
    display_tz = _display_tz(v, root.get("display_tz", "UTC"))
    pipeline = v.section(PipelineConfig, root.get("pipeline", {}), ("pipeline",))

    providers = v.table(root.get("providers", {}), ("providers",))
    v.unknown(providers, _PROVIDER_KEYS, ("providers",))
    embedding = v.section(EmbeddingConfig, providers.get("embedding", {}), ("providers", "embedding"))
    history = v.section(HistoryConfig, providers.get("history", {}), ("providers", "history"))

    memory_section = v.table(root.get("memory", {}), ("memory",))
    v.unknown(memory_section, ("retrieval",), ("memory",))
    retrieval = v.section(RetrievalConfig, memory_section.get("retrieval", {}), ("memory", "retrieval"))
    memory = _memory(v, providers.get("memory", {}), retrieval)

    _check_embedding_switches(tree, memory, embedding)
    _check_retrieval_weights(tree, retrieval, embedding.backend != "off")

    budgets = _budgets(v, root.get("budget", {}))
    llm = _llm(v, root.get("llm", {}))
    channels = _channels(v, root.get("channels", {}))

    token = secrets_env.get("DISCORD_TOKEN") or None
    key_names = {s.api_key_env for s in llm.slots.values() if s.api_key_env}
    secrets = Secrets(token, {n: secrets_env.get(n, "") for n in sorted(key_names)})
    return FamiliarConfig(
        familiar_id=familiar_id, aliases=aliases, display_tz=display_tz, pipeline=pipeline,
        memory=memory, embedding=embedding, budgets=budgets, history=history, channels=channels,
        llm=llm, secrets=secrets, sources=tuple(tree.sources),
    )


def _reject_legacy(tree: _Tree, root: Mapping[str, Any]) -> None:
    """Keys of the reference design: say what replaced them, not just 'unknown key'."""
    for path, hint in _LEGACY_HINTS.items():
        if _lookup(root, path) is not _MISSING:
            raise ConfigError(f"{tree.source_of(path)}: {dotted(path)} is no longer a setting: {hint}")
    memory = _lookup(root, ("providers", "memory"))
    for name, knobs in (memory.items() if isinstance(memory, dict) else ()):
        if isinstance(knobs, dict) and "tick_interval_s" in knobs:
            path = ("providers", "memory", name, "tick_interval_s")
            raise ConfigError(
                f"{tree.source_of(path)}: {dotted(path)} is no longer a setting: projectors "
                "run when the turn-watermark sensor sees new turns; set [pipeline].sensor_interval_s"
            )


def _lookup(root: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = root
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


_MISSING = object()


def _aliases(v: _Validator, value: Any) -> tuple[str, ...]:
    path = ("aliases",)
    if not isinstance(value, list) or not all(isinstance(a, str) and a.strip() for a in value):
        raise v.bad(path, value, 'an array of non-empty strings, e.g. ["Sapphire", "Saph"]',
                    wrong_type=not isinstance(value, list))
    return tuple(a.strip() for a in value)


def _display_tz(v: _Validator, value: Any) -> str:
    path = ("display_tz",)
    expected = 'an IANA time zone name such as "America/Los_Angeles" or "UTC"'
    if not isinstance(value, str) or not value:
        raise v.bad(path, value, expected, wrong_type=not isinstance(value, str))
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(
            f"{v.tree.source_of(path)}: display_tz = {_shown(value)} is not a known time zone; "
            f"expected {expected}"
        ) from None
    return value


def _memory(v: _Validator, value: Any, retrieval: RetrievalConfig) -> MemoryConfig:
    path = ("providers", "memory")
    table = v.table(value, path)
    known = registry.known_projectors()
    v.unknown(table, ("projectors",) + tuple(sorted(set(KNOB_TABLES) | set(known))), path)

    raw = table.get("projectors", list(registry.DEFAULT_PROJECTORS))
    ppath = path + ("projectors",)
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise v.bad(ppath, raw, f"an array of projector names from: {', '.join(known)}",
                    wrong_type=not isinstance(raw, list))
    for name in raw:
        if name not in known:
            raise ConfigError(
                f"{v.tree.source_of(ppath)}: {dotted(ppath)} = {_shown(raw)} lists unknown "
                f"projector {name!r}; valid: {', '.join(known)}"
            )
    duplicates = sorted({p for p in raw if raw.count(p) > 1})
    if duplicates:
        raise ConfigError(
            f"{v.tree.source_of(ppath)}: {dotted(ppath)} = {_shown(raw)} lists "
            f"{', '.join(repr(d) for d in duplicates)} more than once"
        )

    # Knob tables are validated even for inactive projectors, so toggling one keeps its tuning.
    knobs = {name: v.section(cls, table.get(name, {}), path + (name,)) for name, cls in KNOB_TABLES.items()}
    extra = {
        name: FrozenDict(copy.deepcopy(v.table(knob_table, path + (name,))))
        for name, knob_table in table.items()
        if name != "projectors" and name not in KNOB_TABLES
    }
    return MemoryConfig(projectors=tuple(raw), retrieval=retrieval,
                        extra_knobs=FrozenDict(extra), **knobs)


def _embedding_backends() -> tuple[str, ...]:
    # Imported late: embedders imports this module (and numpy) at import time.
    from familiar_pipeline.models.embedders import known_embedders

    return known_embedders()


def _three_switches() -> str:
    backends = ", ".join(b for b in _embedding_backends() if b != "off")
    return (
        "semantic recall needs all three switches: [providers.embedding].backend set to one of "
        f"{backends}; \"fact_embedding\" in [providers.memory].projectors; and "
        "[memory.retrieval].embedding_weight > 0 (for turns: \"turn_embedding\" in the projectors; "
        "[memory.retrieval].turn_embedding_weight is used only when it is active)"
    )


def _check_embedding_switches(tree: _Tree, memory: MemoryConfig, embedding: EmbeddingConfig) -> None:
    if embedding.backend != "off":
        return
    backend_src = tree.source_of(("providers", "embedding", "backend"))
    for projector in ("fact_embedding", "turn_embedding"):
        if projector in memory.projectors:
            ppath = ("providers", "memory", "projectors")
            raise ConfigError(
                f"{tree.source_of(ppath)}: {dotted(ppath)} lists \"{projector}\" but "
                f"[providers.embedding].backend = \"off\" (set in {backend_src}); {_three_switches()}"
            )
    wpath = ("memory", "retrieval", "embedding_weight")
    # The default weight is the measured best for when embeddings are on; with them off it is
    # inert (and a rendered config that repeats it must load). Only another positive weight,
    # chosen with no vectors to score, is an error.
    chosen = memory.retrieval.embedding_weight != RetrievalConfig().embedding_weight
    if memory.retrieval.embedding_weight > 0 and chosen:
        raise ConfigError(
            f"{tree.source_of(wpath)}: {dotted(wpath)} = {memory.retrieval.embedding_weight!r} "
            f"but [providers.embedding].backend = \"off\" (set in {backend_src}), so no vector "
            f"could ever be scored; {_three_switches()}"
        )


def _check_retrieval_weights(tree: _Tree, retrieval: RetrievalConfig, embedding_on: bool = True) -> None:
    weights = ("bm25_weight", "recency_weight", "importance_weight", "embedding_weight")
    # With the embedder off the embedding weight ranks nothing, whatever its value.
    counted = weights if embedding_on else weights[:3]
    if all(getattr(retrieval, w) == 0 for w in counted):
        path = ("memory", "retrieval", "bm25_weight")
        raise ConfigError(
            f"{tree.source_of(path)}: [memory.retrieval] sets every weight to 0, so retrieval "
            f"could not rank anything; expected at least one of {', '.join(weights)} > 0"
        )


def _budgets(v: _Validator, value: Any) -> Mapping[str, TierBudget]:
    path = ("budget",)
    table = v.table(value, path)
    v.unknown(table, BUDGET_TIERS, path, what="budget tier")
    budgets = {tier: v.section(TierBudget, table[tier], path + (tier,), base=DEFAULT_BUDGETS[tier])
               if tier in table else DEFAULT_BUDGETS[tier]
               for tier in ("voice", "text", "background")}
    return FrozenDict(budgets)


def _llm(v: _Validator, value: Any) -> LlmConfig:
    path = ("llm",)
    table = v.table(value, path)
    v.unknown(table, ("max_concurrency",) + LLM_SLOTS, path)
    for slot in LLM_SLOTS:
        slot_table = table.get(slot, {})
        if isinstance(slot_table, dict) and "api_key" in slot_table:
            kpath = path + (slot, "api_key")
            raise ConfigError(
                f"{v.tree.source_of(kpath)}: {dotted(kpath)} must not be in a config file (value "
                f"hidden); keep keys in the environment and set {dotted(path + (slot, 'api_key_env'))} "
                "to the variable's NAME, e.g. \"OPENROUTER_API_KEY\""
            )
    concurrency = v.section(LlmConfig, {k: table[k] for k in ("max_concurrency",) if k in table},
                            path, exclude=("slots",))
    slots = {
        slot: v.section(LlmSlotConfig, table.get(slot, {}), path + (slot,),
                        base=DEFAULT_LLM_SLOTS[slot], exclude=("name",))
        for slot in ("reply", "background")
    }
    return replace(concurrency, slots=FrozenDict(slots))


_CHANNEL_ID = re.compile(r"^[0-9]{1,20}$")


def _channels(v: _Validator, value: Any) -> Mapping[int, ChannelConfig]:
    path = ("channels",)
    table = v.table(value, path)
    channels: dict[int, ChannelConfig] = {}
    for key, section in table.items():
        if not _CHANNEL_ID.fullmatch(key) or int(key) == 0:
            raise ConfigError(
                f"{v.tree.source_of(path + (key,))}: [channels.{_key(key)}] is invalid: a channel "
                'key must be a Discord channel id (digits), e.g. [channels."123456789012345678"]'
            )
        channel_id = int(key)
        if channel_id in channels:
            raise ConfigError(
                f"{v.tree.source_of(path + (key,))}: [channels.{_key(key)}] repeats channel "
                f"{channel_id} (written differently elsewhere)"
            )
        channels[channel_id] = v.section(ChannelConfig, section, path + (key,),
                                         base=ChannelConfig(channel_id=channel_id),
                                         exclude=("channel_id",))
    return FrozenDict(dict(sorted(channels.items())))


# --------------------------------------------------------------------------- loading


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_AT_END = re.compile(r"\s*\(at end of document\)\s*$")


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error names the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        position = _TOML_POSITION.search(message)
        if position:
            line, column = int(position.group(1)), int(position.group(2))
            message = message[: position.start()]
        else:
            lines = text.split("\n")
            line, column = len(lines), len(lines[-1]) + 1
            message = _TOML_AT_END.sub("", message) + " (at end of file)"
        raise ConfigError(f"{path}: invalid TOML at line {line}, column {column}: {message}") from None


def parse_env_value(raw: str) -> Any:
    """A TOML literal (`5`, `true`, `["a"]`, `"x"`), else the raw text as a string."""
    try:
        doc = tomllib.loads(f"value = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    return doc["value"] if set(doc) == {"value"} else raw


def env_overrides(env: Mapping[str, str]) -> list[tuple[str, tuple[str, ...], Any]]:
    """`(variable, key path, value)` for each override in `env`, in a stable order.

    ``FAMILIAR__A__B__C`` sets ``[a.b].c``; ``FAMILIAR_FASTEMBED_MODEL_PATH`` is the
    named shortcut for ``[providers.embedding].fastembed_model_path`` and wins
    over a generic variable for the same key.
    """
    overrides = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        segments = name[len(ENV_PREFIX):].split("__")
        if not segments or any(not s for s in segments):
            raise ConfigError(
                f"environment variable {name}: cannot tell which setting it overrides; expected "
                "FAMILIAR__<SECTION>__<KEY> with '__' between each level, "
                "e.g. FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE=5"
            )
        overrides.append((name, tuple(s.lower() for s in segments), parse_env_value(env[name])))
    model_path = env.get("FAMILIAR_FASTEMBED_MODEL_PATH")
    if model_path is not None:
        overrides.append(("FAMILIAR_FASTEMBED_MODEL_PATH",
                          ("providers", "embedding", "fastembed_model_path"), model_path))
    return overrides


def _apply_override(tree: _Tree, variable: str, path: tuple[str, ...], value: Any) -> None:
    node: Any = tree.data
    for depth, key in enumerate(path[:-1]):
        child = node.get(key)
        if child is not None and not isinstance(child, dict):
            raise ConfigError(
                f"environment variable {variable}: {dotted(path[: depth + 1])} is "
                f"{_kind(child)}, not a table, so it has no key {path[depth + 1]!r}"
            )
        node = child if child is not None else {}
    nested: Any = value
    for key in reversed(path):
        nested = {key: nested}
    tree.merge(nested, f"environment variable {variable}")


def load_config(familiar_id: str | None = None, *, root: Path | None = None,
                env: Mapping[str, str] | None = None) -> FamiliarConfig:
    """The effective, validated configuration of one familiar.

    `familiar_id` defaults to ``FAMILIAR_ID`` from `env`, else ``"familiar"``;
    `root` is the data root (default ``paths.data_root()``); `env` defaults to
    ``os.environ`` and supplies overrides and secrets.
    """
    env = os.environ if env is None else env
    if familiar_id:
        paths.validate_familiar_id(familiar_id)
    elif env.get("FAMILIAR_ID"):
        familiar_id = env["FAMILIAR_ID"]
        try:
            paths.validate_familiar_id(familiar_id)
        except paths.InvalidFamiliarId as exc:
            raise paths.InvalidFamiliarId(f"environment variable FAMILIAR_ID: {exc}") from None
    else:
        familiar_id = DEFAULT_FAMILIAR_ID
    if root is None:
        configured = env.get("FAMILIAR_DATA_ROOT")
        root = Path(configured).expanduser().resolve() if configured else paths.data_root()

    tree = _Tree()
    default_file = paths.default_dir(root) / "character.toml"
    tree.merge(read_toml(default_file), str(default_file))
    own_file = paths.FamiliarPaths.for_id(familiar_id, root).character_toml
    if own_file.is_file():
        tree.merge(read_toml(own_file), str(own_file))
    for variable, key_path, value in env_overrides(env):
        _apply_override(tree, variable, key_path, value)
    return _build(tree, familiar_id, env)


# --------------------------------------------------------------------------- rendering


def _render_section(lines: list[str], header: str, obj: Any, exclude: tuple[str, ...] = (),
                    comments: Mapping[str, str] | None = None) -> None:
    lines.append("")
    lines.append(f"[{header}]")
    for f in fields(obj):
        if f.name in exclude:
            continue
        value = getattr(obj, f.name)
        if value is None:
            value = ""
        line = f"{f.name} = {toml_value(value)}"
        if comments and f.name in comments:
            line += f"  # {comments[f.name]}"
        lines.append(line)


def render_config(cfg: FamiliarConfig) -> str:
    """The effective configuration as TOML text, with secrets masked.

    Everything but the comments is valid TOML that loads back to the same
    settings; secrets appear only as "***set***" or "(unset)".
    """
    lines = [f"# Effective configuration of familiar {cfg.familiar_id!r} "
             f"(display name {cfg.display_name!r}).", "# Merged from, in order:"]
    lines += [f"#   {source}" for source in cfg.sources] or ["#   (built in defaults)"]
    token = "***set***" if cfg.secrets.discord_token else "(unset)"
    lines += ["# Secrets come from the environment only:",
              f"#   DISCORD_TOKEN = {json.dumps(token)}", ""]
    lines.append(f"aliases = {toml_value(list(cfg.aliases))}")
    lines.append(f"display_tz = {toml_value(cfg.display_tz)}")
    _render_section(lines, "pipeline", cfg.pipeline)

    lines += ["", "[providers.memory]", f"projectors = {toml_value(list(cfg.memory.projectors))}"]
    for name in KNOB_TABLES:
        _render_section(lines, f"providers.memory.{name}", getattr(cfg.memory, name))
    for name, knobs in cfg.memory.extra_knobs.items():
        lines += ["", f"[providers.memory.{_key(name)}]"]
        lines += [f"{_key(k)} = {toml_value(v)}" for k, v in knobs.items()]
    _render_section(lines, "providers.embedding", cfg.embedding)
    _render_section(lines, "providers.history", cfg.history)
    _render_section(lines, "memory.retrieval", cfg.memory.retrieval)
    for tier in ("voice", "text", "background"):
        _render_section(lines, f"budget.{tier}", cfg.budgets[tier])

    lines += ["", "[llm]", f"max_concurrency = {cfg.llm.max_concurrency}"]
    for name, slot in cfg.llm.slots.items():
        if slot.api_key_env:
            state = "***set***" if cfg.secrets.is_set(slot.api_key_env) else "(unset)"
            note = f"{slot.api_key_env} is {state}"
        else:
            note = "none named: litellm reads the provider's usual variable"
        _render_section(lines, f"llm.{name}", slot, exclude=("name",), comments={"api_key_env": note})

    for channel_id, channel in cfg.channels.items():
        lines += ["", f'[channels."{channel_id}"]']
        for f in fields(channel):
            value = getattr(channel, f.name)
            if f.name == "channel_id" or value is None:
                continue
            lines.append(f"{f.name} = {toml_value(value)}")
    return "\n".join(lines) + "\n"
