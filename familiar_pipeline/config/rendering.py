"""Configuration as TOML text: values and key paths in messages, and `render_config`."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from typing import Any, Mapping

from familiar_pipeline.config.schema import FamiliarConfig

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def key_text(segment: str) -> str:
    """A key as TOML writes it: bare when it can be, else quoted."""
    return segment if _BARE_KEY.fullmatch(segment) else json.dumps(segment, ensure_ascii=False)


def dotted(path: tuple[str, ...]) -> str:
    """('providers','memory','rich_note','batch_size') -> '[providers.memory.rich_note].batch_size'."""
    if len(path) == 1:
        return key_text(path[0])
    return f"[{'.'.join(key_text(p) for p in path[:-1])}].{key_text(path[-1])}"


def table_name(path: tuple[str, ...]) -> str:
    return f"[{'.'.join(key_text(p) for p in path)}]" if path else "the top level"


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
        return "{ " + ", ".join(f"{key_text(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)



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
    for name, knobs in cfg.memory.tables.items():
        if isinstance(knobs, Mapping):
            lines += ["", f"[providers.memory.{key_text(name)}]"]
            lines += [f"{key_text(k)} = {toml_value(v)}" for k, v in knobs.items()]
        else:
            _render_section(lines, f"providers.memory.{key_text(name)}", knobs)
    _render_section(lines, "providers.embedding", cfg.embedding)
    _render_section(lines, "providers.history", cfg.history)
    _render_section(lines, "memory.retrieval", cfg.memory.retrieval)
    lines += ["", "[memory.scopes]", f"dm_sees_person = {toml_value(cfg.memory.scopes.dm_sees_person)}"]
    lines += ["", "[memory.scopes.groups]"]
    lines += [f"{key_text(name)} = {toml_value(list(members))}" for name, members in cfg.memory.scopes.groups.items()]
    _render_section(lines, "memory.privacy", cfg.memory.privacy)
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
