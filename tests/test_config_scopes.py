"""``[memory.scopes]``: joining scopes on purpose, validated at config load (issue 26 item 2)."""

from __future__ import annotations

import tomllib

import pytest

from familiar_pipeline.config import ScopesConfig, load_config, render_config
from tests.test_config import FID, error_of, load, write


def test_default_is_strict(tmp_path):
    cfg = load(tmp_path)
    assert cfg.memory.scopes.groups == {}
    assert cfg.memory.scopes.visible("guild:1") == ("guild:1",)
    assert cfg.memory.scopes.visible("channel:9") == ("channel:9",)


def test_groups_join_their_members_only(tmp_path):
    write(tmp_path, '[memory.scopes]\ngroups = { team = ["guild:111", "guild:222"], '
                    'other = ["guild:222", "channel:5"] }\n')
    scopes = load(tmp_path).memory.scopes
    assert scopes.groups == {"other": ("guild:222", "channel:5"), "team": ("guild:111", "guild:222")}
    assert scopes.visible("guild:111") == ("guild:111", "guild:222")
    # guild:222 is in both groups: it sees both, but the groups do not chain for guild:111.
    assert scopes.visible("guild:222") == ("guild:222", "channel:5", "guild:111")
    assert scopes.visible("channel:5") == ("channel:5", "guild:222")
    assert scopes.visible("guild:333") == ("guild:333",)


def test_groups_as_a_subtable_and_familiar_member(tmp_path):
    write(tmp_path, '[memory.scopes.groups]\nlegacy = ["guild:111", "familiar"]\n')
    assert load(tmp_path).memory.scopes.visible("guild:111") == ("guild:111", "familiar")


def test_dm_sees_person_is_off_unless_set(tmp_path):
    assert load(tmp_path).memory.scopes.dm_sees_person is False
    write(tmp_path, '[memory.scopes]\ndm_sees_person = true\n')
    scopes = load(tmp_path).memory.scopes
    assert scopes.dm_sees_person is True and scopes.visible("channel:5") == ("channel:5",), \
        "the person is joined per DM, by who it is with (prompt/scoping.visible_scopes)"


def test_render_round_trips(tmp_path):
    write(tmp_path, '[memory.scopes]\ngroups = { team = ["guild:111", "guild:222"] }\n')
    cfg = load(tmp_path)
    text = render_config(cfg)
    assert tomllib.loads(text)["memory"]["scopes"]["groups"] == {"team": ["guild:111", "guild:222"]}
    (tmp_path / FID / "character.toml").write_text(text, encoding="utf-8")
    assert load_config(FID, root=tmp_path, env={}).memory.scopes == cfg.memory.scopes


@pytest.mark.parametrize("toml, expected", [
    ('[memory.scopes]\ngroups = { team = ["guild:1", "server:2"] }',
     "[memory.scopes.groups].team lists 'server:2', which is not a scope"),
    ('[memory.scopes]\ngroups = { team = ["guild:abc"] }',
     "[memory.scopes.groups].team lists 'guild:abc', which is not a scope"),
    ('[memory.scopes]\ngroups = { team = ["guild:0"] }', "lists 'guild:0', which is not a scope"),
    ('[memory.scopes]\ngroups = { team = [] }', "expected a non-empty array of scopes"),
    ('[memory.scopes]\ngroups = { team = "guild:1" }', "expected a non-empty array of scopes"),
    ('[memory.scopes]\ngroups = { team = ["guild:1", "guild:1"] }', "lists 'guild:1' more than once"),
    ('[memory.scopes]\ngroups = { "a b" = ["guild:1"] }', "invalid group name 'a b'"),
    ('[memory.scopes]\ngroups = ["guild:1"]', "expected a table of named arrays of scopes"),
    ('[memory.scopes]\ngrups = {}', "unknown key 'grups' in [memory.scopes]"),
    ('[memory.scope]\ngroups = {}', "unknown key 'scope' in [memory]"),
    ('[memory.scopes]\ndm_sees_person = "yes"', "dm_sees_person"),
    ('[memory.scopes]\ndm_sees_person = 1', "dm_sees_person"),
])
def test_bad_values_are_one_line_errors(tmp_path, toml, expected):
    message = error_of(tmp_path, toml)
    assert expected in message
    assert "character.toml" in message


def test_scopes_config_is_frozen():
    with pytest.raises(TypeError):
        ScopesConfig().groups["x"] = ("guild:1",)  # type: ignore[index]
