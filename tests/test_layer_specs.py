"""Prompt layers declared like projectors (issue 49): each module's `LayerSpec`, registered once,
is what the stack, the debug keys, the scope report, `/memory` and config read.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from familiar_bot import self_service as ss
from familiar_bot.prompt.layers import registry
from familiar_bot.prompt.layers.spec import BudgetKnob, HeldPart, LayerSpec
from familiar_bot.prompt.layers.stack import BUILTIN_LAYERS, default_layers
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.prompt.types import AssemblyContext
from familiar_pipeline.config import (
    ConfigError,
    FamiliarConfig,
    TierBudget,
    catalogue,
    default_budgets,
    layer_names,
    load_config,
    render_config,
)
from familiar_pipeline.projectors import builtin  # noqa: F401 - every built-in table declared before a store opens
from tests.test_assembly import CASS, World

REPO = Path(__file__).resolve().parents[1]


def test_the_builtin_specs_are_the_stack_in_their_order():
    names = [spec.name for spec in BUILTIN_LAYERS]
    positions = [spec.position for spec in BUILTIN_LAYERS]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert layer_names() == tuple(names) == registry.layer_names()
    assert [layer.name for layer in default_layers()] == names
    assert registry.debug_keys() == {"standing_wishes": "wishes", "rag_context": "rag"}
    assert [s.name for s in registry.scoped()] == ["standing_wishes", "conversation_summary", "reflection",
                                                   "people_dossier", "rag_context"]
    assert [s.held.key for s in registry.held_parts() if s.held] == ["wishes", "dossier"]
    # Every [budget.<tier>] key is one layer's: TierBudget's fields, in stack order.
    owned = [k.name for spec in BUILTIN_LAYERS for k in spec.budget]
    assert [f.name for f in dataclasses.fields(TierBudget())] == owned and len(set(owned)) == len(owned)


def test_tier_budget_is_a_frozen_dataclass_of_the_declared_keys():
    text = default_budgets()["text"]
    assert isinstance(text, TierBudget) and TierBudget() == default_budgets()["voice"]
    assert text.wishes_tokens == 400 and text.total_tokens == 18000
    assert dataclasses.replace(text, rag_tokens=5).rag_tokens == 5 and text.rag_tokens == 2400
    assert pickle.loads(pickle.dumps(text)) == text and copy.deepcopy(text) == text
    assert hash(text) == hash(TierBudget(**dataclasses.asdict(text)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        text.rag_tokens = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        TierBudget(nope_tokens=5)


def test_spec_declarations_are_checked():
    with pytest.raises(ValueError, match="lower-case name"):
        LayerSpec("Bad Name", object, position=1)
    with pytest.raises(TypeError, match="position must be an integer"):
        LayerSpec("ok", object, position="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the text default 0 is not an integer >= 1"):
        BudgetKnob("x_tokens", voice=1, text=0, background=1)
    assert LayerSpec("ok", object, position=1, scope_parts=("a",)).scoped
    assert LayerSpec("ok", object, position=1).debug_key == "ok"


class Echo:
    """A plugin's layer: the cue, capped by its own budget key."""

    name = "echo"

    def invalidation_key(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return f"{ctx.cue}|{memory.config.budget_for(ctx.tier).echo_tokens}"

    def build_with_debug(self, ctx: AssemblyContext, memory: MemoryView) -> tuple[str, dict]:
        cap = memory.config.budget_for(ctx.tier).echo_tokens
        return f"## Echo\n{ctx.cue[:cap]}", {"cap": cap, "scope_excluded": 2}

    def build(self, ctx: AssemblyContext, memory: MemoryView) -> str:
        return self.build_with_debug(ctx, memory)[0]


def _echo_held(memory: MemoryView, person: str, visible: tuple[str, ...]) -> str:
    return f"{person} in {','.join(visible)}"


ECHO = LayerSpec("echo", Echo, position=250, debug_key="echoed", scoped=True,
                 budget=(BudgetKnob("echo_tokens", voice=3, text=5, background=7),),
                 held=HeldPart("echo", held=_echo_held, lines=lambda value: [f"Echo: {value}"],
                               export=_echo_held))


@pytest.fixture
def echo():
    registry.register_layer(ECHO)
    yield ECHO
    registry.unregister_layer("echo")


def test_a_plugin_layer_registers_once_and_everything_reads_it(tmp_path, echo):
    assert layer_names()[2] == "echo"  # position 250: after the operating mode
    assert default_budgets()["background"].echo_tokens == 7 and TierBudget().echo_tokens == 3
    world = World(tmp_path, '[budget.text]\necho_tokens = 4\n[channels."10"]\nprompt_layers = ["echo", "character_card"]\n')
    try:
        cfg = world.config()
        assert cfg.budget_for("text").echo_tokens == 4 and cfg.channel(10).prompt_layers == ("echo", "character_card")
        assert "echo_tokens = 4" in render_config(cfg)
        assert cfg.channel(11).prompt_layers == layer_names()
        world.say("hello", CASS)
        world.sync()
        prompt = world.assembler().assemble(AssemblyContext("fam", 10, 1, "text", "abcdefgh"))
        assert prompt.system_prompt.startswith("## Echo\nabcd")
        assert prompt.debug["echoed"]["cap"] == 4 and "echo" not in prompt.debug
        assert prompt.debug["scopes"]["excluded"] == {"echo": 2}
        memory = MemoryView(world.paths, cfg, turn_log=world.log)
        try:
            held = ss.held_about(memory, CASS[0], 10, 1)
            assert held.echo == f"{CASS[0]} in guild:1" and "Echo: " in ss.render_held(held)
            assert ss.export_about(memory, CASS[0], 10, 1)["echo"] == held.echo
        finally:
            memory.close()
        world.paths.character_toml.write_text("[budget.voice]\necho_tokens = 0\n")
        with pytest.raises(ConfigError, match=r"\[budget.voice\].echo_tokens = 0 is invalid: expected an integer >= 1"):
            world.config()
    finally:
        world.close()


def test_unregistering_a_layer_takes_it_out_of_config(tmp_path, echo):
    registry.unregister_layer("echo")
    try:
        assert "echo" not in layer_names() and not hasattr(TierBudget(), "echo_tokens")
        assert FamiliarConfig().budget_for("text") == default_budgets()["text"]
        (tmp_path / "fam").mkdir()
        (tmp_path / "fam" / "character.toml").write_text("[budget.text]\necho_tokens = 4\n")
        with pytest.raises(ConfigError, match="unknown key 'echo_tokens' in \\[budget.text\\]"):
            load_config("fam", root=tmp_path, env={})
    finally:
        registry.register_layer(ECHO)


def test_two_layers_cannot_declare_one_budget_key(echo):
    twin = dataclasses.replace(ECHO, name="twin")
    with pytest.raises(ValueError, match="budget key 'echo_tokens' \\(declared by 'echo'\\) is declared twice"):
        registry.register_layer(twin)
    assert "twin" not in layer_names()
    with pytest.raises(ValueError, match="declared twice"):
        catalogue.register_layer("solo", position=1, budget=(BudgetKnob("a", 1, 1, 1), BudgetKnob("a", 1, 1, 1)))


def test_a_pipeline_process_learns_the_layers_through_the_entry_point():
    """Config imports nothing of the bot; loading a config finds the built-in layers (and their budget
    keys) through the `familiar.layers` entry point, as it finds the projectors."""
    script = ("import json, sys\n"
              "import familiar_pipeline.config as config, familiar_pipeline.projectors.builtin\n"
              "before = sorted(m for m in sys.modules if m.startswith('familiar_bot'))\n"
              "names = config.layer_names()\n"
              "print(json.dumps({'before': before, 'names': list(names), 'wishes': config.default_budgets()['text'].wishes_tokens,"
              " 'stack': 'familiar_bot.prompt.layers.stack' in sys.modules}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAMILIAR")}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    out = json.loads(done.stdout)
    assert out["before"] == [] and out["stack"]
    assert out["names"] == list(layer_names()) and out["wishes"] == 400
