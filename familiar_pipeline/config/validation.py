"""Validation of the merged configuration tree by pydantic, with one-line errors.

What a value may be is declared once, in each dataclass field's `knob(...)` metadata
(`schema`). `table_type` turns such a dataclass into a pydantic TypedDict of strict,
bounded fields (booleans are never numbers, numbers never booleans, floats must be
finite); `_root_adapter` nests those tables into the shape of character.toml, and one
`TypeAdapter.validate_python` call checks the whole tree. `build` then fills the
frozen dataclasses and checks the few rules that span sections.

Every failure leaves pydantic as a `PydanticCustomError` whose context holds `say`: a
function of the key path pydantic reports that returns the path whose source to blame
and the message. So a message names the file or environment variable that set the
value, the dotted key, the value and what is valid; pydantic reports errors in the
order of the schema's sections, and the first one is raised as `ConfigError`.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
import zoneinfo
from dataclasses import fields, replace
from types import GenericAlias
from typing import Annotated, Any, Callable, Mapping, Protocol, get_type_hints

from pydantic import Field, Strict, TypeAdapter, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from familiar_pipeline.config.rendering import dotted, key_text, table_name, toml_value
from familiar_pipeline.config.schema import (
    DEFAULT_PROJECTORS,
    DEFAULT_LLM_SLOTS,
    ChannelConfig,
    ConfigError,
    EmbeddingConfig,
    FamiliarConfig,
    FrozenDict,
    HistoryConfig,
    LlmConfig,
    LlmSlotConfig,
    MemoryConfig,
    PipelineConfig,
    SCOPE_HINT,
    SCOPE_PATTERN,
    PrivacyConfig,
    RetrievalConfig,
    ScopesConfig,
    Secrets,
    budget_class,
    default_budgets,
    embedding_backends,
)
from familiar_pipeline.config import catalogue

Path = tuple[str, ...]
Say = Callable[[Path], tuple[Path, str]]


class Tree(Protocol):
    """The merged tree (`loading.Tree`): its data and which source set each key path."""

    data: dict[str, Any]
    sources: list[str]

    def source_of(self, path: Path) -> str: ...


def _knob_class(name: str) -> type | None:
    """The knob dataclass projector `name` declares; None when it has none
    (its table, if any, then passes through untyped)."""
    return catalogue.knob_class(name)


# --------------------------------------------------------------------------- messages


_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
          (list, "an array"), (dict, "a table"))  # bool before int: True is an int to Python


def kind_of(value: Any) -> str:
    return next((kind for cls, kind in _KINDS if isinstance(value, cls)), f"a {type(value).__name__}")


def shown(value: Any) -> str:
    text = toml_value(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(say: Say) -> PydanticCustomError:
    return PydanticCustomError("familiar_config", "invalid configuration", {"say": say})


def _fail_at(where: Path, text: str) -> PydanticCustomError:
    """An error about the key at `where`, wherever pydantic met it."""
    return _fail(lambda _path: (where, text))


def _invalid(value: Any, tail: str, hide: bool = False) -> PydanticCustomError:
    """`<key> = <value> <tail>`, e.g. tail "is invalid: expected an integer >= 1"."""
    text = "(value hidden: it may be a secret)" if hide else shown(value)
    return _fail(lambda path: (path, f"{dotted(path)} = {text} {tail}"))


def _checked(value: Any, handler: Callable[[Any], Any], expected: Callable[[], str],
             hide: bool = False) -> Any:
    """pydantic's verdict on `value`, phrased: ", got a string" only when the value itself has
    the wrong type (not for a bound, a pattern or one bad item of an array)."""
    try:
        return handler(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False)[0]
        got = f", got {kind_of(value)}" if first["type"].endswith("_type") and not first["loc"] else ""
        raise _invalid(value, f"is invalid: expected {expected()}{got}", hide) from None


def _unknown(key: str, valid: tuple[str, ...], what: str) -> PydanticCustomError:
    hint = difflib.get_close_matches(key, list(valid), n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    options = ", ".join(sorted(valid)) or "(none)"
    return _fail(lambda path: (path + (key,), f"unknown {what} {key!r} in {table_name(path)}; "
                                              f"valid: {options}{did_you_mean}"))


def _config_error(tree: Tree, exc: ValidationError) -> ConfigError:
    error = exc.errors(include_url=False)[0]
    path = tuple(str(p) for p in error["loc"])
    say = (error.get("ctx") or {}).get("say")
    if say is None:  # a pydantic error this module does not phrase: still one line, still located
        return ConfigError(f"{tree.source_of(path)}: {dotted(path) if path else 'configuration'} "
                           f"is invalid: {error['msg']}")
    where, text = say(path)
    return ConfigError(f"{tree.source_of(where)}: {text}")


# --------------------------------------------------------------------------- schema from knobs


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


def _expected(hint: Any, meta: Mapping[str, Any], optional: bool) -> str:
    choices = _choices(meta)
    if hint is bool:
        return "true or false"
    if hint in (int, float):
        return ("an integer" if hint is int else "a number") + _bounds(meta)
    if hint is not str:
        return "an array of strings" + (f" from: {', '.join(choices)}" if choices else "")
    if choices:
        return f"one of: {', '.join(toml_value(c) for c in choices)}"
    if meta.get("pattern_hint"):
        return str(meta["pattern_hint"]) + (' (or "" for none)' if optional else "")
    return "a non-empty string" if meta.get("nonempty") else "a string"


_STRINGS = tuple[Annotated[str, Strict()], ...]


def _leaf(hint: Any, meta: Mapping[str, Any]) -> Any:
    """The pydantic type of one knob: strict type, bounds and pattern, then choices.

    For `str | None` and `int | None` knobs an empty string means None (TOML has no null).
    """
    optional = hint in (str | None, int | None)
    if optional:
        hint = str if hint == (str | None) else int
    bounds = Field(ge=meta.get("minimum"), le=meta.get("maximum"), gt=meta.get("above"))
    pattern = meta.get("pattern")
    inner = {
        bool: Annotated[bool, Strict()],
        int: Annotated[int, Strict(), bounds],
        float: Annotated[float, Strict(), bounds, Field(allow_inf_nan=False)],
        str: Annotated[str, Strict(), Field(pattern=pattern.pattern if pattern else None)],
        tuple[str, ...]: _STRINGS,
    }.get(hint)
    if inner is None:
        raise TypeError(f"no validator for knob type {hint!r}")  # a bug in a knob class
    hide = bool(meta.get("hide_bad_value"))

    def check(value: Any, handler: Callable[[Any], Any]) -> Any:
        if optional and isinstance(value, str) and not (value.strip() if hint is str else value):
            return None
        expected = functools.partial(_expected, hint, meta, optional)
        result = _checked(value, handler, expected, hide and isinstance(value, str))
        choices = _choices(meta)
        if hint is str and ((meta.get("nonempty") and not result.strip())
                            or (choices and result not in choices)):
            raise _invalid(value, f"is invalid: expected {expected()}")
        if hint == tuple[str, ...]:
            unknown = [item for item in result if choices and item not in choices]
            if unknown:
                raise _invalid(value, f"is invalid: unknown name {unknown[0]!r}; valid: {', '.join(choices)}")
            duplicates = sorted({v for v in result if result.count(v) > 1})
            if duplicates:
                raise _invalid(value, f"is invalid: {', '.join(repr(d) for d in duplicates)} "
                                      "listed more than once")
        return result

    return Annotated[inner, WrapValidator(check)]


def _table(inner: Any, valid: tuple[str, ...] | None, what: str = "key") -> Any:
    """A TOML table: must be a table, and (unless `valid` is None) hold only `valid` keys."""

    def check(value: Any, handler: Callable[[Any], Any]) -> Any:
        if not isinstance(value, dict):
            raise _fail(lambda path: (path, f"{dotted(path)} = {shown(value)} is invalid: expected a "
                                            f"table {table_name(path)}, got {kind_of(value)}"))
        if valid is not None:
            for key in value:
                if key not in valid:
                    raise _unknown(key, valid, what)
        return handler(value)

    return Annotated[inner, WrapValidator(check)]


def _typed_table(name: str, members: Mapping[str, Any], what: str = "key") -> Any:
    return _table(TypedDict(name, dict(members), total=False), tuple(members), what)  # type: ignore[operator]


@functools.cache
def table_type(cls: type, exclude: tuple[str, ...] = ()) -> Any:
    """The pydantic type of a TOML table that sets some fields of knob dataclass `cls`."""
    hints = get_type_hints(cls)
    members = {f.name: _leaf(hints[f.name], f.metadata) for f in fields(cls) if f.name not in exclude}
    return _typed_table(f"{cls.__name__}Table", members)


def _member(cls: type, name: str) -> Any:
    """The pydantic type of one field of knob dataclass `cls`, for a table shared with others."""
    spec = next(f for f in fields(cls) if f.name == name)
    return _leaf(get_type_hints(cls)[name], spec.metadata)


# --------------------------------------------------------------------------- the tree's shape


_ALIASES = 'an array of non-empty strings, e.g. ["Sapphire", "Saph"]'
_TZ = 'an IANA time zone name such as "America/Los_Angeles" or "UTC"'
_CHANNEL_ID = re.compile(r"^[0-9]{1,20}$")
# Tiers and slots in the order they are checked and kept (BUDGET_TIERS and LLM_SLOTS are sorted).
_TIERS = ("voice", "text", "background")
_SLOTS = ("reply", "background", "judge")


def _aliases(value: Any, handler: Callable[[Any], Any]) -> tuple[str, ...]:
    aliases = _checked(value, handler, lambda: _ALIASES)
    if not all(a.strip() for a in aliases):
        raise _invalid(value, f"is invalid: expected {_ALIASES}")
    return tuple(a.strip() for a in aliases)


def _display_tz(value: Any, handler: Callable[[Any], Any]) -> str:
    zone = _checked(value, handler, lambda: _TZ)
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise _invalid(value, f"is not a known time zone; expected {_TZ}") from None
    return zone


def _projectors(value: Any, handler: Callable[[Any], Any]) -> tuple[str, ...]:
    known = catalogue.selectable_projectors()
    names = _checked(value, handler, lambda: f"an array of projector names from: {', '.join(known)}")
    for name in names:
        if name not in known:
            raise _invalid(value, f"lists unknown projector {name!r}; valid: {', '.join(known)}")
    duplicates = sorted({p for p in names if names.count(p) > 1})
    if duplicates:
        raise _invalid(value, f"lists {', '.join(repr(d) for d in duplicates)} more than once")
    return names


def _channel_keys(value: Any, handler: Callable[[Any], Any]) -> dict[str, Any]:
    """Channel tables are keyed by Discord channel id; "5" and "05" are the same channel."""
    seen: set[int] = set()
    for key in value if isinstance(value, dict) else ():
        where = ("channels", key)
        if not _CHANNEL_ID.fullmatch(key) or int(key) == 0:
            raise _fail_at(where, (
                f"[channels.{key_text(where[1])}] is invalid: a channel key must be a Discord channel "
                'id (digits), e.g. [channels."123456789012345678"]'))
        if int(key) in seen:
            raise _fail_at(where, (
                f"[channels.{key_text(where[1])}] repeats channel {int(where[1])} "
                "(written differently elsewhere)"))
        seen.add(int(key))
    return handler(value)


_GROUP_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _scope_groups(value: Any, handler: Callable[[Any], Any]) -> dict[str, tuple[str, ...]]:
    """``[memory.scopes].groups``: named arrays of scope strings, each scope valid and listed once."""
    if not isinstance(value, dict):
        raise _invalid(value, "is invalid: expected a table of named arrays of scopes, "
                              'e.g. groups = { team = ["guild:111", "guild:222"] }')
    groups: dict[str, tuple[str, ...]] = {}
    for name, members in value.items():
        where = ("memory", "scopes", "groups", name)
        if not _GROUP_NAME.fullmatch(name):
            raise _fail_at(where, f"memory.scopes.groups has an invalid group name {name!r}: "
                                  "expected letters, digits, '-' or '_'")
        if (not isinstance(members, list) or not members
                or not all(isinstance(m, str) for m in members)):
            raise _fail_at(where, f"{dotted(where)} = {shown(members)} is invalid: expected a non-empty "
                                  f"array of scopes, each {SCOPE_HINT}")
        for member in members:
            if not SCOPE_PATTERN.fullmatch(member):
                raise _fail_at(where, f"{dotted(where)} lists {member!r}, which is not a scope: "
                                      f"expected {SCOPE_HINT}")
        duplicates = sorted({m for m in members if members.count(m) > 1})
        if duplicates:
            raise _fail_at(where, f"{dotted(where)} lists {', '.join(repr(d) for d in duplicates)} "
                                  "more than once")
        groups[name] = tuple(members)
    return groups


def _no_api_key(value: Any, handler: Callable[[Any], Any]) -> Any:
    """An API key pasted into a file is refused, and not echoed."""
    if isinstance(value, dict) and "api_key" in value:
        raise _fail(lambda path: (path + ("api_key",), (
            f"{dotted(path + ('api_key',))} must not be in a config file (value hidden); keep keys in "
            f"the environment and set {dotted(path + ('api_key_env',))} to the variable's NAME, "
            'e.g. "OPENROUTER_API_KEY"')))
    return handler(value)


@functools.lru_cache(maxsize=8)
def _root_adapter(knob_tables: tuple[tuple[str, type | None], ...], budget: type) -> TypeAdapter:
    """The whole tree's schema, for these `[providers.memory.<name>]` knob classes and the
    `[budget.<tier>]` keys of these prompt layers (`budget`, a `schema.budget_class()`)."""
    memory: dict[str, Any] = {"projectors": Annotated[_STRINGS, WrapValidator(_projectors)]}
    for name, cls in knob_tables:
        memory[name] = table_type(cls) if cls is not None else _table(dict[str, Any], None)
    llm = {"max_concurrency": _member(LlmConfig, "max_concurrency")}
    slot: Any = Annotated[table_type(LlmSlotConfig, ("name",)), WrapValidator(_no_api_key)]
    llm |= dict.fromkeys(_SLOTS, slot)
    # dict[str, <channel table>], spelled as the alias it is: the member type is built at run time.
    channels = _table(Annotated[GenericAlias(dict, (str, table_type(ChannelConfig, ("channel_id",)))),
                                WrapValidator(_channel_keys)], None)
    root = _typed_table("FamiliarTable", {
        "aliases": Annotated[_STRINGS, WrapValidator(_aliases)],
        "display_tz": Annotated[Annotated[str, Strict(), Field(min_length=1)], WrapValidator(_display_tz)],
        "pipeline": table_type(PipelineConfig),
        "providers": _typed_table("ProvidersTable", {
            "embedding": table_type(EmbeddingConfig),
            "history": table_type(HistoryConfig),
            "memory": _typed_table("MemoryTable", memory),
        }),
        "memory": _typed_table("MemorySectionTable", {
            "retrieval": table_type(RetrievalConfig),
            "scopes": _typed_table("ScopesTable", {
                "groups": Annotated[dict[str, Any], WrapValidator(_scope_groups)],
                "dm_sees_person": _leaf(bool, {})}),
            "privacy": table_type(PrivacyConfig),
        }),
        "budget": _typed_table("BudgetTable", dict.fromkeys(_TIERS, table_type(budget)), what="budget tier"),
        "llm": _typed_table("LlmTable", llm),
        "channels": channels,
    })
    return TypeAdapter(root)


# --------------------------------------------------------------------------- build


def build(tree: Tree, familiar_id: str, secrets_env: Mapping[str, str]) -> FamiliarConfig:
    """The frozen `FamiliarConfig` of a merged tree, or the first problem as `ConfigError`."""
    _reject_legacy(tree)
    # Every registered projector, in registration order; the schema is rebuilt when this changes.
    knob_classes = {name: _knob_class(name) for name in catalogue.projectors()}
    known = set(catalogue.selectable_projectors())  # the always-on ones have no table to write
    schema_tables = tuple((name, cls) for name, cls in knob_classes.items() if name in known)
    # The prompt layers' budget keys, as registered (each layer's spec declares its own).
    budget_type: type = budget_class()
    defaults = default_budgets()
    try:
        data = _root_adapter(schema_tables, budget_type).validate_python(tree.data)
    except ValidationError as exc:
        raise _config_error(tree, exc) from None

    providers = data.get("providers", {})
    embedding = replace(EmbeddingConfig(), **providers.get("embedding", {}))
    history = replace(HistoryConfig(), **providers.get("history", {}))
    retrieval = replace(RetrievalConfig(), **data.get("memory", {}).get("retrieval", {}))
    table = providers.get("memory", {})
    # Knob tables are validated even for inactive projectors, so toggling one keeps its tuning.
    # A projector's knobs: its knob dataclass if it has one, else the table as written.
    tables: dict[str, Any] = {}
    for name, cls in knob_classes.items():
        if cls is not None:
            tables[name] = replace(cls(), **table.get(name, {}))
        elif name in table:
            tables[name] = FrozenDict(copy.deepcopy(table[name]))
    scopes_table = data.get("memory", {}).get("scopes", {})
    groups = scopes_table.get("groups", {})
    memory = MemoryConfig(projectors=tuple(table.get("projectors", DEFAULT_PROJECTORS)),
                          retrieval=retrieval, tables=FrozenDict(tables),
                          scopes=ScopesConfig(groups=FrozenDict(dict(sorted(groups.items()))),
                                              dm_sees_person=bool(scopes_table.get("dm_sees_person", False))),
                          privacy=replace(PrivacyConfig(), **data.get("memory", {}).get("privacy", {})))
    _check_embedding_switches(tree, memory, embedding)
    _check_retrieval_weights(tree, retrieval, embedding.backend != "off")

    budget = data.get("budget", {})
    budgets = {tier: replace(defaults[tier], **budget.get(tier, {})) for tier in _TIERS}
    llm_table = data.get("llm", {})
    slots = {slot: replace(DEFAULT_LLM_SLOTS[slot], **llm_table.get(slot, {})) for slot in _SLOTS}
    llm = LlmConfig(max_concurrency=llm_table.get("max_concurrency", LlmConfig().max_concurrency),
                    slots=FrozenDict(slots))
    channels = {int(key): replace(ChannelConfig(channel_id=int(key)), **section)
                for key, section in data.get("channels", {}).items()}

    token = secrets_env.get("DISCORD_TOKEN") or None
    key_names = {s.api_key_env for s in llm.slots.values() if s.api_key_env}
    secrets = Secrets(token, {n: secrets_env.get(n, "") for n in sorted(key_names)})
    return FamiliarConfig(
        familiar_id=familiar_id, aliases=data.get("aliases", ()), display_tz=data.get("display_tz", "UTC"),
        pipeline=replace(PipelineConfig(), **data.get("pipeline", {})), memory=memory, embedding=embedding,
        budgets=FrozenDict(budgets), history=history, channels=FrozenDict(dict(sorted(channels.items()))),
        llm=llm, secrets=secrets, sources=tuple(tree.sources),
    )


# --------------------------------------------------------------------------- rules beyond one value


_LEGACY_HINTS: dict[Path, str] = {
    ("providers", "history", "window_size"):
        "it was split into voice_window_size and text_window_size",
}


def _reject_legacy(tree: Tree) -> None:
    """Keys of an earlier design: say what replaced them, not just 'unknown key'."""
    root = tree.data
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


def _lookup(root: Mapping[str, Any], path: Path) -> Any:
    node: Any = root
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


_MISSING = object()


def _three_switches() -> str:
    backends = ", ".join(b for b in embedding_backends() if b != "off")
    return (
        "semantic recall needs all three switches: [providers.embedding].backend set to one of "
        f"{backends}; \"fact_embedding\" in [providers.memory].projectors; and "
        "[memory.retrieval].embedding_weight > 0 (for turns: \"turn_embedding\" in the projectors; "
        "[memory.retrieval].turn_embedding_weight is used only when it is active)"
    )


def _check_embedding_switches(tree: Tree, memory: MemoryConfig, embedding: EmbeddingConfig) -> None:
    if embedding.backend != "off":
        return
    backend_src = tree.source_of(("providers", "embedding", "backend"))
    for projector in (name for name, entry in catalogue.projectors().items() if entry.needs_embedder):
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


def _check_retrieval_weights(tree: Tree, retrieval: RetrievalConfig, embedding_on: bool = True) -> None:
    weights = ("bm25_weight", "recency_weight", "importance_weight", "embedding_weight")
    # With the embedder off the embedding weight ranks nothing, whatever its value.
    counted = weights if embedding_on else weights[:3]
    if all(getattr(retrieval, w) == 0 for w in counted):
        path = ("memory", "retrieval", "bm25_weight")
        raise ConfigError(
            f"{tree.source_of(path)}: [memory.retrieval] sets every weight to 0, so retrieval "
            f"could not rank anything; expected at least one of {', '.join(weights)} > 0"
        )
