"""Prompt layers declared by their specs (issue 49) change nothing a familiar sees or writes.

The fixtures under ``tests/fixtures/layers_main/`` were written by this module's `snapshot`
run against main before the change (``python -m tests.test_layer_compat <dir>`` in a checkout
of it): a character.toml setting every budget key and a channel's ``prompt_layers`` loads to
the same values (and renders to the same settings), the same bad values fail with the same
messages, and the same memory assembles byte-identical prompts in every tier, with the same
``/context`` scope report.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from familiar_pipeline.config import ConfigError, load_config, render_config

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "layers_main"

# Every budget key of every tier set to something other than its default, a channel that
# reorders and drops layers, one that keeps the default stack, and an environment override.
OWN_TOML = """
[budget.voice]
wishes_tokens = 111
rag_tokens = 222
max_rag_facts = 3
lorebook_tokens = 333
[budget.text]
recent_history_tokens = 5000
max_history_turns = 50
lorebook_tokens = 77
max_lorebook_entries = 2
summary_tokens = 444
[budget.background]
dossier_tokens = 1234
summary_tokens = 99
reflection_tokens = 98
max_reflections = 4
max_dossier_people = 5
max_rag_turns = 6
[channels."123"]
prompt_layers = ["recent_history", "character_card", "standing_wishes", "rag_context"]
history_window_size = 50
[channels."456"]
respond_to_all = true
"""
ENV = {"FAMILIAR__BUDGET__TEXT__WISHES_TOKENS": "321", "FAMILIAR__BUDGET__VOICE__MAX_HISTORY_TURNS": "7"}

BAD: list[tuple[str, dict[str, str]]] = [
    ("[budget.text]\nwishes_tokens = 0\n", {}),
    ("[budget.text]\nwishes_token = 5\n", {}),
    ("[budget.loud]\nrag_tokens = 5\n", {}),
    ('[budget.voice]\nrag_tokens = "many"\n', {}),
    ("[budget.voice]\nmax_rag_facts = 1.5\n", {}),
    ("[budget.text]\nrecent_history_tokens = true\n", {}),
    ("[budget]\ntext = 5\n", {}),
    ("budget = 5\n", {}),
    ('[channels."5"]\nprompt_layers = ["character_card", "nope"]\n', {}),
    ('[channels."5"]\nprompt_layers = ["lorebook", "lorebook"]\n', {}),
    ('[channels."5"]\nprompt_layers = "lorebook"\n', {}),
    ('[channels."5"]\nprompt_layers = [1]\n', {}),
    ("", {"FAMILIAR__BUDGET__VOICE__RAG_TOKENS": "-1"}),
    ("", {"FAMILIAR__BUDGET__TEXT__NOPE_TOKENS": "5"}),
]


def _own(root: Path, text: str) -> None:
    own = root / "fam" / "character.toml"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text(text)


def _config_values(cfg: Any) -> dict[str, Any]:
    budgets = {tier: {**dict(sorted(dataclasses.asdict(cfg.budget_for(tier)).items())),
                      "total_tokens": cfg.budget_for(tier).total_tokens} for tier in ("voice", "text", "background")}
    channels = {str(cid): {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(ch).items()}
                for cid, ch in cfg.channels.items()}
    default_channel = dataclasses.asdict(cfg.channel(999))
    default_channel["prompt_layers"] = list(default_channel["prompt_layers"])
    return {"budgets": budgets, "channels": channels, "default_channel": default_channel,
            "rendered": tomllib.loads(render_config(cfg))}


def config_snapshot(root: Path) -> dict[str, Any]:
    """What config makes of the files above, and the messages of the bad values, paths replaced by <root>."""
    out: dict[str, Any] = {"defaults": _config_values(load_config("fam", root=root, env={}))}
    _own(root, OWN_TOML)
    out["own"] = _config_values(load_config("fam", root=root, env=ENV))
    errors = []
    for text, env in BAD:
        _own(root, text)
        try:
            load_config("fam", root=root, env=env)
            errors.append("(loaded)")
        except ConfigError as exc:
            errors.append(str(exc).replace(str(root), "<root>"))
    out["errors"] = errors
    return out


# --------------------------------------------------------------------------- prompts


def prompt_snapshot(root: Path) -> list[dict[str, Any]]:
    """Prompts assembled over memory that fills every layer, in every tier and in a reordered channel."""
    from familiar_bot.prompt.types import AssemblyContext
    from familiar_pipeline.projectors.dossiers import tables as dossier_db
    from familiar_pipeline.projectors.reflections import tables as reflection_db
    from familiar_pipeline.projectors.summary import tables as summary_db
    from familiar_pipeline.projectors.wishes import tables as wishes_db
    from familiar_pipeline.projectors.wishes.run import drafts
    from tests.test_assembly import BO, CASS, MIA, SCOPE, World

    world = World(root, '[channels."20"]\nprompt_layers = ["standing_wishes", "recent_history", "people_dossier"]\n')
    try:
        world.paths.character_md.write_text("You are Fam, a patient owl.\n")
        world.paths.lorebook_toml.write_text('[[entries]]\nkeys = ["Berlin"]\ncontent = "Berlin is where the crew met."\n')
        said = [world.say("I just moved to Berlin with my oboe"), world.say("Call me Sammy from now on."),
                world.say("Keep answers short please.", BO), world.say("Mia here, I bake bread on Sundays", MIA),
                world.say("The match on Friday went badly", CASS, channel=20),
                world.say("Berlin is cold in winter", BO, channel=20),
                world.say("Never bring up my ex.", CASS, channel=30, guild=None),  # a DM: another scope
                world.say("Anyway, hello again", CASS)]
        found = drafts(said, 200)
        with world.store.transaction():
            wishes_db.insert_wishes(world.store, found, now=world.clock)
            wishes_db.retire(world.store, [(d.person_key, d.scope, d.point) for d in found])
        oboe = world.fact("Cass plays the oboe", subjects=[CASS], sources=[said[0].id], importance=6)
        bread = world.fact("Mia bakes bread on Sundays", subjects=[MIA], sources=[said[3].id], importance=4)
        world.fact("Cass moved to Berlin", subjects=[CASS], sources=[said[0].id], importance=8)
        summary_db.put_summary(world.store, "They talked about Berlin and music.", said[3].id, scope=SCOPE)
        reflection_db.append_reflection(world.store, channel_id=10, text="Cass settles in.", cited_turn_ids=[said[0].id],
                                        cited_fact_ids=[oboe.id], last_turn_id=said[0].id, last_fact_id=oboe.id, scope=SCOPE)
        dossier_db.put_dossier(world.store, CASS[0], "Cass, oboist, new in Berlin.", oboe.id, scope=SCOPE)
        dossier_db.put_dossier(world.store, MIA[0], "Mia bakes.", bread.id, scope=SCOPE)
        dossier_db.put_dossier(world.store, BO[0], "Bo, elsewhere.", bread.id, scope="guild:9")
        world.sync()
        assembler = world.assembler()
        out = []
        for channel, tier, cue in ((10, "text", "what about Berlin and the oboe?"), (10, "voice", "bread on Sundays"),
                                   (10, "background", "Berlin"), (20, "text", "how was the match in Berlin?"),
                                   (None, "text", "oboe")):
            prompt = assembler.assemble(AssemblyContext("fam", channel, 1, tier, cue))
            out.append({
                "channel": channel, "tier": tier, "cue": cue,
                "system_prompt": prompt.system_prompt,
                "history": [[m.role, m.content, m.name] for m in prompt.history],
                "sections": [[s.name, s.text, s.tokens] for s in prompt.sections],
                "order": prompt.debug["order"],
                "debug_blocks": sorted(prompt.debug),
                "scopes": prompt.debug["scopes"],
                "wishes": prompt.debug.get("wishes"),
            })
        return out
    finally:
        world.close()


# --------------------------------------------------------------------------- the tests


def _fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def test_a_character_toml_of_main_loads_to_the_same_values_and_messages(tmp_path):
    assert config_snapshot(tmp_path) == _fixture("config.json")


def test_the_same_memory_assembles_byte_identical_prompts(tmp_path):
    got, want = prompt_snapshot(tmp_path), _fixture("prompts.json")
    assert len(got) == len(want)
    for mine, main in zip(got, want):
        assert mine["system_prompt"] == main["system_prompt"], (mine["channel"], mine["tier"])
        assert mine == main


if __name__ == "__main__":  # write the fixtures (run against main before the change)
    import tempfile

    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
        (target / "config.json").write_text(json.dumps(config_snapshot(Path(one)), indent=1, sort_keys=True) + "\n")
        (target / "prompts.json").write_text(json.dumps(prompt_snapshot(Path(two)), indent=1) + "\n")
