"""The test run's warning filters hide third-party noise only: the same warning from our code still shows."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
from _pytest.config import parse_warning_filter
from pydantic.warnings import PydanticDeprecatedSince20

FILTERS = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())[
    "tool"]["pytest"]["ini_options"]["filterwarnings"]

FIELDS = "The `__fields__` attribute is deprecated, use the `model_fields` class property instead."
READONLY = "Item 'index' on TypedDict class 'ChatCompletionThinkingBlock' is using the `ReadOnly` qualifier."
AUDIOOP = "'audioop' is deprecated and slated for removal in Python 3.13"


def shown(message: str, category: type[Warning], module: str) -> bool:
    """Whether the project's filters let this warning, raised from `module`, through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        for entry in FILTERS:  # pytest applies the ini filters in order, later ones winning
            warnings.filterwarnings(*parse_warning_filter(entry, escape=False))
        warnings.warn_explicit(message, category, filename=module.replace(".", "/") + ".py", lineno=1, module=module)
    return bool(caught)


@pytest.mark.parametrize("message, category, third_party", [
    (FIELDS, PydanticDeprecatedSince20, "dagster_shared.dagster_model.pydantic_compat_layer"),
    (READONLY, UserWarning, "pydantic._internal._generate_schema"),
    (AUDIOOP, DeprecationWarning, "discord.player"),
])
def test_third_party_noise_is_hidden_and_ours_is_not(message, category, third_party):
    assert not shown(message, category, third_party)
    assert shown(message, category, "familiar_pipeline.storage.store"), "the same warning from our code"
    assert shown(message, category, third_party + "_other"), "only that module, not its neighbours"


def test_a_deprecation_of_ours_shows():
    assert shown("this knob is deprecated", DeprecationWarning, "familiar_pipeline.config.loading")
