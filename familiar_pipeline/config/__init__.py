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
from familiar_pipeline.config import schema
from familiar_pipeline.config.schema import *  # noqa: F403 (the names in schema.__all__)
from familiar_pipeline.projectors.spec import knob

__all__ = [
    *schema.__all__, "ENV_PREFIX", "dotted", "env_overrides", "knob", "load_config", "parse_env_value",
    "read_toml", "render_config", "toml_value",
]
