"""Typed, immutable configuration of one familiar (character.toml).

The public names live in four modules; import them from here:

- `schema`: the frozen config dataclasses and their `knob(...)` rules (a projector's knob
  dataclass lives in its projector module, and config finds it through the registry);
- `validation`: the pydantic schema derived from those rules, and its one-line errors;
- `loading`: `load_config` (default file, the familiar's file, environment overrides);
- `rendering`: `render_config`, the effective configuration as TOML with secrets masked.
"""

from familiar_pipeline.config.loading import (
    ENV_PREFIX,
    env_overrides,
    load_config,
    parse_env_value,
    read_toml,
)
from familiar_pipeline.config.rendering import dotted, render_config, toml_value
from familiar_pipeline.config.schema import (
    BUDGET_TIERS,
    DEFAULT_BUDGETS,
    DEFAULT_FAMILIAR_ID,
    DEFAULT_LLM_SLOTS,
    LAYER_NAMES,
    LLM_SLOTS,
    MESSAGE_RENDERINGS,
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
    RetrievalConfig,
    Secrets,
    TierBudget,
)
from familiar_pipeline.projectors.spec import knob

__all__ = [
    "BUDGET_TIERS", "DEFAULT_BUDGETS", "DEFAULT_FAMILIAR_ID", "DEFAULT_LLM_SLOTS", "ENV_PREFIX",
    "LAYER_NAMES", "LLM_SLOTS", "MESSAGE_RENDERINGS", "ChannelConfig", "ConfigError", "EmbeddingConfig",
    "FamiliarConfig", "FrozenDict", "HistoryConfig", "LlmConfig", "LlmSlotConfig", "MemoryConfig",
    "PipelineConfig", "RetrievalConfig", "Secrets", "TierBudget", "dotted", "env_overrides", "knob",
    "load_config", "parse_env_value", "read_toml", "render_config", "toml_value",
]
