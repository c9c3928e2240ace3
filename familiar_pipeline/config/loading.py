"""Loading one familiar's configuration: files, deep merge, environment overrides.

Loading order, later wins:

1. ``_default/character.toml`` (``places.default_dir``): every knob, commented;
2. the familiar's own ``data/familiars/<id>/character.toml``, deep-merged (tables
   merge key by key; scalars and lists replace whole, so a ``projectors`` list
   replaces the default list);
3. the offline demo's settings, for the demo familiar only (``config/demo.py``:
   ``familiar up --demo`` names it in ``FAMILIAR_DEMO``);
4. environment overrides: ``FAMILIAR__SECTION__SUB__KEY=<TOML literal>`` for any
   knob, plus ``FAMILIAR_FASTEMBED_MODEL_PATH``.

Every leaf of the merged tree remembers which file or environment variable set it,
so an error names the source that actually holds the bad value. The tree is then
validated once (`validation.build`) into frozen dataclasses.
"""

from __future__ import annotations

import copy
import os
import re
import threading
import tomllib
from pathlib import Path
from typing import Any, Mapping

from cachetools import LRUCache

from familiar_pipeline.config import places
from familiar_pipeline.config.demo import demo_settings
from familiar_pipeline.config.rendering import dotted
from familiar_pipeline.config.schema import DEFAULT_FAMILIAR_ID, ConfigError, FamiliarConfig
from familiar_pipeline.config.validation import build, kind_of

ENV_PREFIX = "FAMILIAR__"


class Tree:
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



_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_AT_END = re.compile(r"\s*\(at end of document\)\s*$")


# Parsed TOML by file text: the turn sensor loads every familiar's config at every tick, and
# parsing the shared defaults file again for each of a thousand familiars costs seconds.
_PARSED: LRUCache = LRUCache(maxsize=512)
_PARSED_LOCK = threading.Lock()


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error names the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with _PARSED_LOCK:
        parsed = _PARSED.get(text)
    if parsed is not None:
        return copy.deepcopy(parsed)  # callers may change what they get
    parsed = _parse_toml(path, text)
    with _PARSED_LOCK:
        _PARSED[text] = parsed
    return copy.deepcopy(parsed)


def _parse_toml(path: Path, text: str) -> dict[str, Any]:
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


def _apply_override(tree: Tree, source: str, path: tuple[str, ...], value: Any) -> None:
    node: Any = tree.data
    for depth, key in enumerate(path[:-1]):
        child = node.get(key)
        if child is not None and not isinstance(child, dict):
            raise ConfigError(
                f"{source}: {dotted(path[: depth + 1])} is "
                f"{kind_of(child)}, not a table, so it has no key {path[depth + 1]!r}"
            )
        node = child if child is not None else {}
    nested: Any = value
    for key in reversed(path):
        nested = {key: nested}
    tree.merge(nested, source)


def load_config(familiar_id: str | None = None, *, root: Path | None = None,
                env: Mapping[str, str] | None = None) -> FamiliarConfig:
    """The effective, validated configuration of one familiar.

    `familiar_id` defaults to ``FAMILIAR_ID`` from `env`, else ``"familiar"``;
    `root` is the data root (default ``places.data_root()``); `env` defaults to
    ``os.environ`` and supplies overrides and secrets.
    """
    env = os.environ if env is None else env
    if familiar_id:
        places.validate_familiar_id(familiar_id)
    elif env.get("FAMILIAR_ID"):
        familiar_id = env["FAMILIAR_ID"]
        try:
            places.validate_familiar_id(familiar_id)
        except places.InvalidFamiliarId as exc:
            raise places.InvalidFamiliarId(f"environment variable FAMILIAR_ID: {exc}") from None
    else:
        familiar_id = DEFAULT_FAMILIAR_ID
    if root is None:
        configured = env.get("FAMILIAR_DATA_ROOT")
        root = Path(configured).expanduser().resolve() if configured else places.data_root()

    tree = Tree()
    default_file = places.default_dir(root) / places.CHARACTER_TOML
    tree.merge(read_toml(default_file), str(default_file))
    own_file = places.familiar_dir(familiar_id, root) / places.CHARACTER_TOML
    if own_file.is_file():
        tree.merge(read_toml(own_file), str(own_file))
    for source, key_path, value in demo_settings(familiar_id, env):
        _apply_override(tree, source, key_path, value)
    for variable, key_path, value in env_overrides(env):
        _apply_override(tree, f"environment variable {variable}", key_path, value)
    return build(tree, familiar_id, env)

