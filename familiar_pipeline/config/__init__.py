"""Typed, immutable configuration of one familiar (character.toml).

The public names live in these modules; import them from here:

- `schema`: the frozen config dataclasses and their `knob(...)` rules (`knobs`); a projector's
  knob dataclass lives in its projector's folder, and config finds it in its `catalogue`,
  where projectors register (config imports no projector: it is the bottom layer); the prompt
  layers' names, order and `[budget.<tier>]` keys register there too, from the bot's layer specs
  (``LAYER_NAMES`` and ``DEFAULT_BUDGETS`` are computed from them on first use);
- `validation`: the pydantic schema derived from those rules, and its one-line errors;
- `loading`: `load_config` (default file, the familiar's file, environment overrides);
- `rendering`: `render_config`, the effective configuration as TOML with secrets masked;
- `places`: which familiar and where its settings live (the id rule, the data root, the shipped
  defaults), what `loading` needs of the file system; `storage.paths` builds on it.

Config imports nothing else of the pipeline (tests/test_architecture.py).
"""

from typing import Any

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
from familiar_pipeline.config.knobs import knob

__all__ = [
    *schema.__all__, "ENV_PREFIX", "dotted", "env_overrides", "knob", "load_config", "parse_env_value",
    "read_toml", "render_config", "toml_value",
]


def __getattr__(name: str) -> Any:
    """``LAYER_NAMES`` and ``DEFAULT_BUDGETS``: computed from the registered prompt layers on use."""
    if name in ("LAYER_NAMES", "DEFAULT_BUDGETS"):
        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
