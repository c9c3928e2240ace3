"""Configuration: defaults, deep merge, env overrides, every validation error, rendering."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from familiar_pipeline.storage import paths

from familiar_pipeline.config import DEFAULT_PROJECTORS
from familiar_pipeline.engine import registry
from familiar_pipeline.config import validation
from familiar_pipeline.config import (
    DEFAULT_BUDGETS,
    LAYER_NAMES,
    ChannelConfig,
    ConfigError,
    EmbeddingConfig,
    FamiliarConfig,
    HistoryConfig,
    LlmConfig,
    LlmSlotConfig,
    MemoryConfig,
    PipelineConfig,
    TierBudget,
    knob,
    load_config,
    parse_env_value,
    render_config,
)

FID = "sapphire"


def write(root: Path, text: str, familiar_id: str = FID) -> Path:
    path = root / familiar_id / "character.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def load(root: Path, familiar_id: str = FID, env: dict | None = None):
    return load_config(familiar_id, root=root, env=env or {})


def error_of(root: Path, text: str, env: dict | None = None) -> str:
    write(root, text)
    with pytest.raises(ConfigError) as info:
        load(root, env=env)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- defaults


def test_defaults_are_the_documented_values(tmp_path):
    cfg = load(tmp_path)
    assert cfg.familiar_id == FID and cfg.display_name == "Sapphire" and cfg.aliases == ()
    assert cfg.display_tz == "UTC"
    assert dataclasses.asdict(cfg.pipeline) == {
        "sensor_interval_s": 5, "max_familiars_per_tick": 100, "max_batches_per_run": 20, "index_quiet_s": 30}
    mem = cfg.memory
    assert mem.projectors == ("rolling_summary", "rich_note", "fact_supersede", "people_dossier", "reflection",
                             "standing_wish")
    assert mem.projectors == DEFAULT_PROJECTORS
    assert (mem.rolling_summary.turns_threshold, mem.rolling_summary.backfill_cap) == (20, 200)
    assert (mem.rich_note.batch_size, mem.rich_note.participants_max) == (20, 30)
    assert (mem.people_dossier.max_facts_per_prompt, mem.people_dossier.fold_min_weight) == (50, 100)
    assert (mem.fact_supersede.new_facts_per_call, mem.people_dossier.batches_per_fold) == (30, 4)
    assert dataclasses.asdict(mem.reflection) == {
        "turns_threshold": 40, "max_reflections_per_tick": 3, "max_turns_per_tick": 50,
        "recent_facts_limit": 20}
    assert mem.fact_supersede.priors_max == 20
    assert mem.fact_embedding.batch_size == 32
    assert dataclasses.asdict(mem.retrieval) == {
        "bm25_weight": 1.0, "recency_weight": 0.0, "importance_weight": 0.6,
        "embedding_weight": 3.0, "fact_overfetch": 4, "turn_embedding_weight": 1.0, "turn_candidates": 50,
        "turn_neighbours": 2, "turn_fusion": "weighted", "turn_context": 0.5, "turn_context_span": 2,
        "turn_vector_search_rows": 20000, "turn_neighbour_hits": 8, "turn_speaker_weight": 0.5,
        "turn_mention_share": 0.5, "turn_time_weight": 1.5, "turn_time_slack_days": 14.0, "turn_when_share": 0.25,
        "turn_reply_credit": 0.8, "turn_substance_length": 0.2, "turn_substance_question": 0.05,
        "turn_substance_depth": 64, "turn_day_spread": 0.6, "turn_day_spread_keep": 4, "turn_thread_hits": 10,
        "turn_thread_similarity": 0.3, "turn_genre": "auto", "turn_familiar_weight": 0.75, "turn_taste_weight": 0.3,
        "turn_passage_chars": 600, "turn_passage_weight": 0.9}
    assert cfg.embedding == EmbeddingConfig(backend="off", dim=256, fastembed_model="BAAI/bge-small-en-v1.5",
                                            fastembed_cache_dir=None, fastembed_model_path=None)
    assert dataclasses.asdict(cfg.history) == {
        "voice_window_size": 100, "text_window_size": 200, "coalesce_max_gap_seconds": 8.0,
        "text_silence_gap_fold_seconds": 0.0}
    assert cfg.llm.max_concurrency == 4
    reply, background = cfg.llm.slot("reply"), cfg.llm.slot("background")
    assert not reply.configured and not background.configured
    assert (reply.cache, background.cache) == (False, True)
    assert reply.api_key_env is None and reply.api_base is None
    assert cfg.channels == {}
    assert cfg.secrets.discord_token is None


def test_budget_defaults_per_tier(tmp_path):
    cfg = load(tmp_path)
    voice, text, background = (cfg.budget_for(t) for t in ("voice", "text", "background"))
    assert (voice.recent_history_tokens, voice.rag_tokens, voice.max_rag_facts, voice.max_lorebook_entries) == (3000, 900, 6, 12)
    assert (text.recent_history_tokens, text.dossier_tokens, text.max_history_turns, text.max_dossier_people) == (8000, 2400, 400, 24)
    assert (background.recent_history_tokens, background.max_rag_turns, background.max_reflections) == (24000, 24, 16)
    # The total is the sum of the seven section caps, never a separate number that could disagree.
    assert (voice.total_tokens, text.total_tokens, background.total_tokens) == (6840, 18000, 52400)
    assert TierBudget() == voice
    with pytest.raises(ConfigError, match="unknown budget tier 'loud'; valid tiers: background, text, voice"):
        cfg.budget_for("loud")


def test_dataclass_defaults_equal_the_shipped_toml(tmp_path):
    """Code that builds config objects directly behaves like a loaded default config."""
    cfg = load(tmp_path)
    assert cfg.memory == MemoryConfig()
    assert cfg.pipeline == PipelineConfig()
    assert cfg.embedding == EmbeddingConfig()
    assert cfg.history == HistoryConfig()
    assert cfg.llm == LlmConfig()
    assert dict(cfg.budgets) == dict(DEFAULT_BUDGETS)
    assert cfg == FamiliarConfig(familiar_id=FID, sources=cfg.sources)


def _leaf_paths(table: dict, prefix: tuple = ()) -> set[tuple]:
    leaves = set()
    for key, value in table.items():
        if isinstance(value, dict):
            leaves |= _leaf_paths(value, prefix + (key,))
        else:
            leaves.add(prefix + (key,))
    return leaves


def test_shipped_file_names_every_knob():
    """The shipped defaults document every setting of config's own sections, and nothing that is not a
    setting. What a projector or a prompt layer declares (its `[providers.memory.<name>]` knob table, its
    `[budget.<tier>]` keys) may be left out: its declared defaults apply, so a new projector or layer
    needs no line there (docs/architecture.md §2)."""
    shipped = _leaf_paths(tomllib.loads((paths.SHIPPED_DEFAULT_DIR / "character.toml").read_text()))
    every_knob = _leaf_paths(tomllib.loads(render_config(FamiliarConfig())))
    assert shipped <= every_knob
    declared = {p for p in every_knob if p[0] == "budget" or (p[:2] == ("providers", "memory") and len(p) == 4)}
    assert every_knob - shipped <= declared


def test_familiar_id_defaults_from_env_then_familiar(tmp_path):
    assert load_config(root=tmp_path, env={}).familiar_id == "familiar"
    assert load_config(root=tmp_path, env={}).display_name == "Familiar"
    assert load_config(root=tmp_path, env={"FAMILIAR_ID": "owl"}).familiar_id == "owl"
    with pytest.raises(paths.InvalidFamiliarId, match="^invalid familiar id 'Not Valid'"):
        load_config("Not Valid", root=tmp_path, env={})
    with pytest.raises(paths.InvalidFamiliarId, match="^environment variable FAMILIAR_ID: invalid familiar id 'x/y'"):
        load_config(root=tmp_path, env={"FAMILIAR_ID": "x/y"})


def test_data_root_default_dir_replaces_the_shipped_defaults(tmp_path):
    (tmp_path / "_default").mkdir()
    (tmp_path / "_default" / "character.toml").write_text("[pipeline]\nsensor_interval_s = 60\n")
    cfg = load(tmp_path)
    assert cfg.pipeline.sensor_interval_s == 60
    assert cfg.memory.rich_note.batch_size == 20  # not in that file: the built-in default
    assert cfg.sources == (str(tmp_path / "_default" / "character.toml"),)


# --------------------------------------------------------------------------- merge


def test_tables_merge_and_lists_replace(tmp_path):
    own = write(tmp_path, """
aliases = ["Saph", "Sapphire"]
[providers.memory]
projectors = ["rich_note"]
[providers.memory.rich_note]
batch_size = 4
[budget.text]
rag_tokens = 100
""")
    cfg = load(tmp_path)
    assert cfg.display_name == "Saph" and cfg.aliases == ("Saph", "Sapphire")
    assert cfg.memory.projectors == ("rich_note",)  # replaced whole, not appended
    assert cfg.memory.rich_note.batch_size == 4
    assert cfg.memory.rich_note.participants_max == 30  # sibling key kept from the default
    assert cfg.budget_for("text").rag_tokens == 100
    assert cfg.budget_for("text").dossier_tokens == 2400  # partial tier inherits its own tier
    assert cfg.budget_for("voice") == DEFAULT_BUDGETS["voice"]
    assert cfg.sources[-1] == str(own)


def test_empty_projector_list_is_valid(tmp_path):
    write(tmp_path, "[providers.memory]\nprojectors = []\n")
    cfg = load(tmp_path)
    assert cfg.memory.projectors == ()
    assert not cfg.memory.is_active("rich_note")


def test_knobs_of_inactive_projectors_are_still_validated(tmp_path):
    message = error_of(tmp_path, "[providers.memory]\nprojectors = []\n"
                                 "[providers.memory.reflection]\nturns_threshold = 0\n")
    assert "[providers.memory.reflection].turns_threshold = 0" in message


def test_channels(tmp_path):
    write(tmp_path, """
[channels."123"]
prompt_layers = ["character_card", "recent_history"]
history_window_size = 50
message_rendering = "name_only"
respond_to_all = true
[channels.456]
respond_to_all = false
""")
    cfg = load(tmp_path)
    assert set(cfg.channels) == {123, 456}
    assert cfg.channels[123] == ChannelConfig(123, ("character_card", "recent_history"), 50, "name_only", True)
    assert cfg.channel(456).prompt_layers == LAYER_NAMES
    assert cfg.channel(999) == ChannelConfig(channel_id=999)
    assert cfg.channel(999).history_window_size is None


def test_llm_slots_and_secrets(tmp_path):
    write(tmp_path, """
[llm.reply]
model = "openrouter/some/model"
api_key_env = "MY_ROUTER_KEY"
api_base = "http://127.0.0.1:8000/v1"
""")
    cfg = load(tmp_path, env={"MY_ROUTER_KEY": "sk-planted-123", "DISCORD_TOKEN": "tok-planted-456"})
    reply = cfg.llm.slot("reply")
    assert reply.configured and reply.api_base == "http://127.0.0.1:8000/v1"
    assert cfg.secrets.api_key_for(reply) == "sk-planted-123"
    assert cfg.secrets.api_key_for(cfg.llm.slot("background")) is None
    assert cfg.secrets.discord_token == "tok-planted-456"
    for text in (repr(cfg.secrets), repr(cfg)):
        assert "sk-planted-123" not in text and "tok-planted-456" not in text
    with pytest.raises(ConfigError, match="unknown LLM slot 'fast'; valid: background, judge, reply"):
        cfg.llm.slot("fast")


# --------------------------------------------------------------------------- env overrides


def test_generic_env_overrides_reach_every_level(tmp_path):
    write(tmp_path, "[providers.memory.rich_note]\nbatch_size = 4\n")
    env = {
        "FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE": "5",
        "FAMILIAR__PROVIDERS__MEMORY__PROJECTORS": '["rich_note", "reflection"]',
        "FAMILIAR__DISPLAY_TZ": "Europe/Berlin",  # not TOML: taken as a plain string
        "FAMILIAR__LLM__BACKGROUND__MODEL": '"openai/gpt-4o-mini"',
        "FAMILIAR__LLM__REPLY__CACHE": "true",
        "FAMILIAR__CHANNELS__77__RESPOND_TO_ALL": "true",
        "FAMILIAR__MEMORY__RETRIEVAL__RECENCY_WEIGHT": "0.25",
    }
    cfg = load(tmp_path, env=env)
    assert cfg.memory.rich_note.batch_size == 5  # env beats the familiar's file
    assert cfg.memory.projectors == ("rich_note", "reflection")
    assert cfg.display_tz == "Europe/Berlin"
    assert cfg.llm.slot("background").model == "openai/gpt-4o-mini"
    assert cfg.llm.slot("reply").cache is True
    assert cfg.channel(77).respond_to_all is True
    assert cfg.memory.retrieval.recency_weight == 0.25
    assert "environment variable FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE" in cfg.sources


def test_fastembed_model_path_env(tmp_path):
    cfg = load(tmp_path, env={"FAMILIAR_FASTEMBED_MODEL_PATH": "/models/minilm"})
    assert cfg.embedding.fastembed_model_path == "/models/minilm"


def test_parse_env_value():
    assert parse_env_value("5") == 5
    assert parse_env_value("true") is True
    assert parse_env_value("1.5") == 1.5
    assert parse_env_value('["a", "b"]') == ["a", "b"]
    assert parse_env_value('"quoted"') == "quoted"
    assert parse_env_value("plain words") == "plain words"
    assert parse_env_value("") == ""
    assert parse_env_value("5\nother = 1") == "5\nother = 1"  # cannot smuggle in more keys


@pytest.mark.parametrize("name, value, expected", [
    ("FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE", "zero",
     "environment variable FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCH_SIZE: "
     '[providers.memory.rich_note].batch_size = "zero" is invalid: expected an integer >= 1, got a string'),
    ("FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCHSIZE", "5",
     "environment variable FAMILIAR__PROVIDERS__MEMORY__RICH_NOTE__BATCHSIZE: unknown key 'batchsize' "
     "in [providers.memory.rich_note]; valid: batch_size, participants_max, quiet_s (did you mean 'batch_size'?)"),
    ("FAMILIAR__PIPELINE____SENSOR_INTERVAL_S", "20",
     "environment variable FAMILIAR__PIPELINE____SENSOR_INTERVAL_S: cannot tell which setting"),
    ("FAMILIAR__DISPLAY_TZ__NAME", '"UTC"',
     "environment variable FAMILIAR__DISPLAY_TZ__NAME: display_tz is a string, not a table"),
])
def test_bad_env_override_names_the_variable(tmp_path, name, value, expected):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, env={name: value})
    assert str(info.value).startswith(expected)


# --------------------------------------------------------------------------- validation errors


def test_toml_syntax_error_gives_file_line_and_column(tmp_path):
    own = write(tmp_path, 'aliases = ["Saph"]\n[pipeline]\nsensor_interval_s = = 5\n')
    message = error_of(tmp_path, own.read_text())
    assert message.startswith(f"{own}: invalid TOML at line 3, column 21: ")


def test_toml_syntax_error_at_end_of_file(tmp_path):
    own = write(tmp_path, "")
    message = error_of(tmp_path, 'aliases = ["Saph"')
    assert message.startswith(f"{own}: invalid TOML at line 1, column 18")


def test_syntax_error_in_the_default_file_names_it(tmp_path):
    (tmp_path / "_default").mkdir()
    bad = tmp_path / "_default" / "character.toml"
    bad.write_text("[pipeline\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: invalid TOML at line 1"):
        load(tmp_path)


def test_non_utf8_file(tmp_path):
    path = write(tmp_path, "")
    path.write_bytes(b"aliases = ['\xff']\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load(tmp_path)


@pytest.mark.parametrize("toml, expected", [
    # wrong types
    ("[pipeline]\nsensor_interval_s = \"15\"",
     '[pipeline].sensor_interval_s = "15" is invalid: expected an integer >= 5, got a string'),
    ("[pipeline]\nsensor_interval_s = 4",
     "[pipeline].sensor_interval_s = 4 is invalid: expected an integer >= 5"),
    ("[providers.memory.rich_note]\nbatch_size = 10.0",
     "[providers.memory.rich_note].batch_size = 10.0 is invalid: expected an integer >= 1, got a float"),
    ("[providers.history]\ncoalesce_max_gap_seconds = -1",
     "[providers.history].coalesce_max_gap_seconds = -1 is invalid: expected a number >= 0.0"),
    ("[memory.retrieval]\nbm25_weight = nan",
     "[memory.retrieval].bm25_weight = nan is invalid: expected a number >= 0.0"),
    ("[llm.reply]\ntemperature = 3",
     "[llm.reply].temperature = 3 is invalid: expected a number from 0.0 to 2.0"),
    ("[llm.reply]\ntimeout_s = 0",
     "[llm.reply].timeout_s = 0 is invalid: expected a number > 0.0"),
    ("[llm.reply]\napi_base = \"localhost:8000\"",
     '[llm.reply].api_base = "localhost:8000" is invalid: expected an http(s):// URL'),
    ("aliases = \"Saph\"",
     'aliases = "Saph" is invalid: expected an array of non-empty strings'),
    ("aliases = [\"\"]", 'aliases = [""] is invalid: expected an array of non-empty strings'),
    ("pipeline = 5", "pipeline = 5 is invalid: expected a table [pipeline], got an integer"),
    ("[providers.embedding]\nfastembed_model = \"\"",
     '[providers.embedding].fastembed_model = "" is invalid: expected a non-empty string'),
    ("[providers.embedding]\ndim = 4", "[providers.embedding].dim = 4 is invalid: expected an integer >= 8"),
    # booleans are never numbers, numbers never booleans
    ("[providers.memory.rich_note]\nbatch_size = true",
     "[providers.memory.rich_note].batch_size = true is invalid: expected an integer >= 1, got a boolean"),
    ("[memory.retrieval]\nimportance_weight = false",
     "[memory.retrieval].importance_weight = false is invalid: expected a number >= 0.0, got a boolean"),
    ("[llm.background]\ncache = 1",
     "[llm.background].cache = 1 is invalid: expected true or false, got an integer"),
    ('[channels."5"]\nrespond_to_all = 0',
     "[channels.5].respond_to_all = 0 is invalid: expected true or false, got an integer"),
    # unknown keys at each level
    ("colour = \"blue\"", "unknown key 'colour' in the top level; valid: aliases, budget, channels,"),
    ("[pipeline]\ntick = 5", "unknown key 'tick' in [pipeline]; valid: index_quiet_s, max_batches_per_run,"),
    ("[providers.voice]\nx = 1", "unknown key 'voice' in [providers]; valid: embedding, history, memory"),
    ("[providers.memory.people_dossier]\nmax_facts = 5",
     "unknown key 'max_facts' in [providers.memory.people_dossier]; valid: batches_per_fold, fold_min_weight, max_facts_per_prompt "
     "(did you mean 'max_facts_per_prompt'?)"),
    ("[providers.memory.dreams]\nx = 1", "unknown key 'dreams' in [providers.memory]; valid: fact_embedding,"),
    ("[providers.embedding]\nmodel = \"x\"", "unknown key 'model' in [providers.embedding]"),
    ("[providers.history]\nwindow = 5", "unknown key 'window' in [providers.history]"),
    ("[memory.recall]\nx = 1", "unknown key 'recall' in [memory]; valid: privacy, retrieval, scopes"),
    ("[memory.retrieval]\nbm25 = 1.0", "unknown key 'bm25' in [memory.retrieval]"),
    ("[budget.text]\ntotal_tokens = 5", "unknown key 'total_tokens' in [budget.text]"),
    ("[llm]\nmax_concurrent_requests = 4",
     "unknown key 'max_concurrent_requests' in [llm]; valid: background, judge, max_concurrency, reply"),
    ("[llm.reply]\ntemp = 1.0", "unknown key 'temp' in [llm.reply]"),
    ('[channels."5"]\ntotal_tokens = 5', "unknown key 'total_tokens' in [channels.5]"),
    # bad budget tier
    ("[budget.loud]\nrag_tokens = 5",
     "unknown budget tier 'loud' in [budget]; valid: background, text, voice"),
    ("[budget.text]\nrag_tokens = 0", "[budget.text].rag_tokens = 0 is invalid: expected an integer >= 1"),
    # projectors
    ("[providers.memory]\nprojectors = [\"rich_notes\"]",
     "[providers.memory].projectors = [\"rich_notes\"] lists unknown projector 'rich_notes'; valid: "
     "fact_embedding, fact_supersede, people_dossier, reflection, rich_note, rolling_summary"),
    ("[providers.memory]\nprojectors = \"rich_note\"",
     '[providers.memory].projectors = "rich_note" is invalid: expected an array of projector names'),
    ("[providers.memory]\nprojectors = [\"rich_note\", \"rich_note\"]",
     "lists 'rich_note' more than once"),
    # layers and channels
    ('[channels."5"]\nprompt_layers = ["character_card", "memes"]',
     "[channels.5].prompt_layers = [\"character_card\", \"memes\"] is invalid: unknown name 'memes'; "
     "valid: character_card, operating_mode, standing_wishes, lorebook, conversation_summary, reflection, "
     "people_dossier, rag_context, recent_history"),
    ('[channels."5"]\nprompt_layers = ["lorebook", "lorebook"]', "'lorebook' listed more than once"),
    ('[channels."5"]\nmessage_rendering = "fancy"',
     '[channels.5].message_rendering = "fancy" is invalid: expected one of: "name_only", "prefixed"'),
    ('[channels."5"]\nhistory_window_size = 0', "[channels.5].history_window_size = 0 is invalid"),
    ('[channels.general]\nrespond_to_all = true',
     "[channels.general] is invalid: a channel key must be a Discord channel id (digits)"),
    ('channels = { "5" = 3 }', "[channels].5 = 3 is invalid: expected a table [channels.5], got an integer"),
    # time zone
    ('display_tz = "Mars/Olympus_Mons"',
     'display_tz = "Mars/Olympus_Mons" is not a known time zone; expected an IANA time zone name '
     'such as "America/Los_Angeles"'),
    ('display_tz = "../etc/passwd"', 'display_tz = "../etc/passwd" is not a known time zone'),
    # embedding switches
    ('[providers.embedding]\nbackend = "neural"',
     '[providers.embedding].backend = "neural" is invalid: expected one of: "fastembed", "hash", "off"'),
    ("[providers.memory]\nprojectors = [\"rich_note\", \"fact_embedding\"]",
     '[providers.memory].projectors lists "fact_embedding" but [providers.embedding].backend = "off"'),
    ("[memory.retrieval]\nembedding_weight = 0.5",
     "[memory.retrieval].embedding_weight = 0.5 but [providers.embedding].backend = \"off\""),
    ("[memory.retrieval]\nbm25_weight = 0\nimportance_weight = 0",
     "[memory.retrieval] sets every weight to 0"),
    # renamed settings say what replaced them
    ("[providers.history]\nwindow_size = 5",
     "[providers.history].window_size is no longer a setting: it was split into voice_window_size"),
    ("[providers.memory.rich_note]\ntick_interval_s = 5.0",
     "[providers.memory.rich_note].tick_interval_s is no longer a setting"),
])
def test_validation_errors_name_file_key_value_and_options(tmp_path, toml, expected):
    own = tmp_path / FID / "character.toml"
    message = error_of(tmp_path, toml + "\n")
    assert message.startswith(f"{own}: "), message
    assert expected in message, message


def test_three_switch_message_names_all_three(tmp_path):
    message = error_of(tmp_path, '[providers.memory]\nprojectors = ["fact_embedding"]\n')
    assert "[providers.embedding].backend" in message
    assert '"fact_embedding" in [providers.memory].projectors' in message
    assert "[memory.retrieval].embedding_weight > 0" in message
    default_file = paths.SHIPPED_DEFAULT_DIR / "character.toml"
    assert f"(set in {default_file})" in message


def test_semantic_recall_with_all_three_switches_loads(tmp_path):
    write(tmp_path, '[providers.embedding]\nbackend = "hash"\n[providers.memory]\n'
                    'projectors = ["rich_note", "fact_embedding"]\n[memory.retrieval]\nembedding_weight = 0.4\n')
    cfg = load(tmp_path)
    assert cfg.embedding.backend == "hash" and cfg.memory.is_active("fact_embedding")


def test_error_names_the_source_that_set_the_bad_value(tmp_path):
    """A bad value from the default file is blamed on it, not on the familiar's file."""
    (tmp_path / "_default").mkdir()
    default_file = tmp_path / "_default" / "character.toml"
    default_file.write_text("[pipeline]\nsensor_interval_s = 1\n")
    write(tmp_path, "[providers.memory.rich_note]\nbatch_size = 4\n")
    with pytest.raises(ConfigError, match=rf"^{default_file}: \[pipeline\]\.sensor_interval_s = 1"):
        load(tmp_path)


def test_api_keys_never_go_in_toml_and_pasted_keys_are_not_echoed(tmp_path):
    message = error_of(tmp_path, '[llm.reply]\napi_key = "sk-planted-789"\n')
    assert "[llm.reply].api_key must not be in a config file" in message
    assert "sk-planted-789" not in message
    message = error_of(tmp_path, '[llm.reply]\napi_key_env = "sk-planted-789"\n')
    assert "expected the NAME of an environment variable" in message
    assert "sk-planted-789" not in message


def test_a_failed_load_changes_no_file(tmp_path):
    own = write(tmp_path, "[pipeline]\nsensor_interval_s = 1\n")
    before = own.read_bytes()
    with pytest.raises(ConfigError):
        load(tmp_path)
    assert own.read_bytes() == before


# --------------------------------------------------------------------------- registry


def test_registry_builtins_and_registration():
    assert registry.known_projectors() == (
        "fact_embedding", "fact_supersede", "people_dossier", "reflection", "rich_note", "rolling_summary",
        "standing_wish", "turn_embedding", "turn_passage_embedding", "turn_window_embedding")
    assert registry.get_projector("fact_embedding").needs_llm is False
    assert registry.get_projector("rich_note").needs_llm is True
    with pytest.raises(registry.UnknownProjectorError, match="unknown memory projector 'nope'; valid: fact_embedding"):
        registry.get_projector("nope")
    with pytest.raises(ValueError, match="invalid projector name"):
        registry.register_projector("Bad Name")
    with pytest.raises(TypeError):
        registry.register_projector("not_callable", factory=42)  # type: ignore[arg-type]


def test_third_party_projector_becomes_valid_with_its_own_knobs(tmp_path):
    write(tmp_path, '[providers.memory]\nprojectors = ["moods"]\n[providers.memory.moods]\nwindow = 7\n')
    with pytest.raises(ConfigError, match="unknown key 'moods' in \\[providers.memory\\]; valid: fact_embedding"):
        load(tmp_path)
    try:
        def first(): return "asset one"
        def second(): return "asset two"
        registry.register_projector("moods", first, description="mood tracking")
        registry.register_projector("moods", second, needs_llm=False)  # re-registering overwrites
        assert registry.get_projector("moods").factory is second
        assert registry.get_projector("moods").needs_llm is False
        cfg = load(tmp_path)
        assert cfg.memory.projectors == ("moods",)
        assert cfg.memory.knobs("moods") == {"window": 7}
        assert cfg.memory.knobs("rich_note") == cfg.memory.rich_note
        assert "[providers.memory.moods]\nwindow = 7" in render_config(cfg)
    finally:
        registry.unregister_projector("moods")


@dataclasses.dataclass(frozen=True)
class MoodKnobs:
    """A projector's knob class as a plugin would write it: a plain dataclass with knob() rules."""

    window: int = knob(7, minimum=1, maximum=30)
    style: str = knob("calm", choices=lambda: ("calm", "lively"))
    weight: float = knob(0.5, above=0.0)
    labels: tuple[str, ...] = knob(("happy",), choices=("happy", "sad"))
    cache_dir: str | None = knob(None)


@pytest.mark.parametrize("toml, expected", [
    ("window = 40", "[providers.memory.moods].window = 40 is invalid: expected an integer from 1 to 30"),
    ("window = true", "[providers.memory.moods].window = true is invalid: expected an integer from 1 to 30, "
                      "got a boolean"),
    ('style = "loud"', '[providers.memory.moods].style = "loud" is invalid: expected one of: "calm", "lively"'),
    ("weight = 0", "[providers.memory.moods].weight = 0 is invalid: expected a number > 0.0"),
    ('labels = ["happy", "meh"]', "unknown name 'meh'; valid: happy, sad"),
    ('labels = ["sad", "sad"]', "'sad' listed more than once"),
    ("windw = 3", "unknown key 'windw' in [providers.memory.moods]; valid: cache_dir, labels, style, weight, "
                  "window (did you mean 'window'?)"),
])
def test_a_projector_knob_class_gets_the_same_rules_and_messages(tmp_path, monkeypatch, toml, expected):
    """Knob sections are validated from the knob class alone, whichever module declares it."""
    builtin = validation._knob_class
    monkeypatch.setattr(validation, "_knob_class", lambda name: MoodKnobs if name == "moods" else builtin(name))
    try:
        registry.register_projector("moods", lambda: "asset", needs_llm=False)
        message = error_of(tmp_path, f'[providers.memory]\nprojectors = ["moods"]\n[providers.memory.moods]\n{toml}\n')
        assert message.startswith(f"{tmp_path / FID / 'character.toml'}: ") and expected in message, message
    finally:
        registry.unregister_projector("moods")


def test_a_projector_knob_class_fills_in_defaults_and_renders(tmp_path, monkeypatch):
    builtin = validation._knob_class
    monkeypatch.setattr(validation, "_knob_class", lambda name: MoodKnobs if name == "moods" else builtin(name))
    try:
        registry.register_projector("moods", lambda: "asset", needs_llm=False)
        assert load(tmp_path).memory.knobs("moods") == MoodKnobs()  # no table: the class defaults
        write(tmp_path, '[providers.memory.moods]\nwindow = 3\nweight = 2\ncache_dir = ""\n')
        cfg = load(tmp_path)
        assert cfg.memory.knobs("moods") == MoodKnobs(window=3, weight=2.0, cache_dir=None)
        assert isinstance(cfg.memory.knobs("moods").weight, float)
        text = render_config(cfg)
        assert "[providers.memory.moods]\nwindow = 3\n" in text
        write(tmp_path, text, familiar_id="copy")
        assert load(tmp_path, familiar_id="copy").memory == cfg.memory
    finally:
        registry.unregister_projector("moods")


# --------------------------------------------------------------------------- rendering


def test_render_masks_secrets_and_round_trips(tmp_path):
    write(tmp_path, """
aliases = ["Saph"]
display_tz = "America/Los_Angeles"
[llm.reply]
model = "openrouter/some/model"
api_key_env = "OPENROUTER_API_KEY"
[llm.background]
api_key_env = "UNSET_KEY_VAR"
[channels."123"]
prompt_layers = ["character_card", "recent_history"]
""")
    env = {"DISCORD_TOKEN": "discord-token-PLANTED", "OPENROUTER_API_KEY": "sk-or-PLANTED",
           "FAMILIAR__PIPELINE__SENSOR_INTERVAL_S": "30"}
    cfg = load(tmp_path, env=env)
    text = render_config(cfg)
    assert "PLANTED" not in text
    assert 'DISCORD_TOKEN = "***set***"' in text
    assert 'api_key_env = "OPENROUTER_API_KEY"  # OPENROUTER_API_KEY is ***set***' in text
    assert 'api_key_env = "UNSET_KEY_VAR"  # UNSET_KEY_VAR is (unset)' in text
    for source in cfg.sources:
        assert f"#   {source}" in text
    assert "environment variable FAMILIAR__PIPELINE__SENSOR_INTERVAL_S" in text

    # Everything but the comments is TOML that loads back to the same settings.
    tomllib.loads(text)
    write(tmp_path, text, familiar_id="copy")
    again = load(tmp_path, familiar_id="copy", env={k: v for k, v in env.items() if not k.startswith("FAMILIAR__")})
    assert dataclasses.replace(again, familiar_id=FID, sources=cfg.sources) == cfg


def test_render_shows_unset_token(tmp_path):
    assert 'DISCORD_TOKEN = "(unset)"' in render_config(load(tmp_path))


def test_slot_config_still_constructs_like_the_skeleton():
    slot = LlmSlotConfig(name="reply", model="x")
    assert slot.configured and slot.temperature == 0.7 and slot.cache is False
    assert not LlmSlotConfig(name="reply", model="  ").configured


def test_config_is_frozen_yet_picklable_and_asdict_friendly(tmp_path):
    import copy
    import pickle

    write(tmp_path, '[channels."5"]\nrespond_to_all = true\n')
    cfg = load(tmp_path, env={"DISCORD_TOKEN": "tok-PLANTED"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.display_tz = "Europe/Berlin"  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        cfg.budgets["voice"] = TierBudget()  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        cfg.channels.clear()  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert copy.deepcopy(cfg) == cfg
    as_dict = dataclasses.asdict(cfg)
    assert as_dict["budgets"]["text"]["rag_tokens"] == 2400
    assert as_dict["channels"][5]["respond_to_all"] is True
    assert hash(cfg.budgets) == hash(load(tmp_path).budgets)
    assert "tok-PLANTED" not in str(as_dict)  # the token stays inside the masked Secrets object
    with pytest.raises(AttributeError):
        cfg.secrets.discord_token = "other"  # type: ignore[misc]
