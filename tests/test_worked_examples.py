"""The worked examples of docs/architecture.md §2 are true: a new prompt layer touches two files,
a new table-backed projector three, and each works with nothing else changed.

Each test copies the repository's files (`git ls-files`, plus new files not yet committed)
into a temporary folder, writes the example there from the doc's own code blocks (each block
whose first line names its path) and the list lines the doc names, counts the files that
differ from the copy, and runs the example in a process of its own: that tree first on
`sys.path`, its own data root and Dagster instance, the scripted offline model only, no
network. The installed package's entry points name modules, so the copy's modules answer them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"

# The list lines each example adds, as the doc names them: (file, [(a line there, that line and the new one)]).
LAYER_LINES = ("familiar_bot/prompt/layers/stack.py",
               [("    people_dossier,\n", "    participants,\n    people_dossier,\n"),
                ("    people_dossier.SPEC,\n", "    participants.SPEC,\n    people_dossier.SPEC,\n")])
WISHES_IMPORT = "from familiar_pipeline.projectors.wishes.spec import SPEC as WISHES\n"
PROJECTOR_LINES = ("familiar_pipeline/projectors/builtin.py",
                   [(WISHES_IMPORT, WISHES_IMPORT + "from familiar_pipeline.projectors.links.spec import SPEC as LINKS\n"),
                    ("    TURN_PASSAGES,\n)", "    TURN_PASSAGES,\n    LINKS,\n)")])


def doc_blocks() -> dict[str, str]:
    """The doc's ```python blocks whose first line is `# <path>.py`, by path, without that line."""
    blocks = {}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S):
        first, _, body = block.partition("\n")
        named = re.fullmatch(r"# ((?:familiar_bot|familiar_pipeline)/[\w/]+\.py)", first.strip())
        if named:
            blocks[named.group(1)] = body
    return blocks


def repository_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                                check=True, capture_output=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the copy needs `git ls-files`")
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def digests(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def tree_with(tmp_path: Path, files: dict[str, str], lines: tuple[str, list[tuple[str, str]]]) -> tuple[Path, list[str]]:
    """A copy of the repository with `files` written and `lines` inserted; the paths that changed."""
    tree = tmp_path / "tree"
    for name in repository_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tree / name)
    before = digests(tree)
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    target, inserts = lines
    text = (tree / target).read_text()
    for anchor, replacement in inserts:
        assert text.count(anchor) == 1, (target, anchor)
        text = text.replace(anchor, replacement)
    (tree / target).write_text(text)
    after = digests(tree)
    changed = sorted(name for name in after if before.get(name) != after[name])
    return tree, changed


def run_in(tree: Path, tmp_path: Path, script: str) -> dict:
    """`script` in a fresh interpreter with `tree` first on sys.path; what it prints as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAMILIAR") and k != "DISCORD_TOKEN"}
    env.update(PYTHONPATH=str(tree), DAGSTER_HOME=str(tmp_path / "dagster_home"), PYTHONDONTWRITEBYTECODE="1",
               FAMILIAR_DATA_ROOT=str(tmp_path / "data"), LITELLM_LOCAL_MODEL_COST_MAP="True")
    (tmp_path / "dagster_home").mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(tree), str(tmp_path / "data")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


PREAMBLE = r"""
import json, sys
from pathlib import Path
tree, root = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
import familiar_bot, familiar_pipeline
assert Path(familiar_bot.__file__).resolve().is_relative_to(tree), familiar_bot.__file__
assert Path(familiar_pipeline.__file__).resolve().is_relative_to(tree), familiar_pipeline.__file__
"""

LAYER_SCRIPT = PREAMBLE + r"""
from familiar_pipeline.config import ConfigError, layer_names, load_config, render_config
from familiar_bot.prompt.types import AssemblyContext
from tests.test_assembly import BO, CASS, MIA, World

world = World(root, '[budget.text]\nparticipants_tokens = 8\n'
                    '[channels."20"]\nprompt_layers = ["participants", "recent_history"]\n')
for who in (MIA, BO, CASS, BO):
    world.say("hello there", who)
world.say("elsewhere", MIA, channel=20)
world.sync()
assembler = world.assembler()
text = assembler.assemble(AssemblyContext("fam", 10, 1, "text", "hi"))
voice = assembler.assemble(AssemblyContext("fam", 10, 1, "voice", "hi"))
other = assembler.assemble(AssemblyContext("fam", 20, 1, "text", "hi"))
config = world.config()
out = {
    "layers": list(layer_names()),
    "order": text.debug["order"],
    "text_section": next(s.text for s in text.sections if s.name == "participants"),
    "voice_section": next(s.text for s in voice.sections if s.name == "participants"),
    "text_debug": text.debug.get("people_here"), "voice_debug": voice.debug.get("people_here"),
    "other_order": other.debug["order"], "other_prompt": other.system_prompt,
    "budget": {tier: config.budget_for(tier).participants_tokens for tier in ("voice", "text", "background")},
    "rendered": "participants_tokens = 8" in render_config(config),
}
world.paths.character_toml.write_text('[budget.text]\nparticipants_tokens = 0\n')
try:
    load_config("fam", root=root, env={})
except ConfigError as exc:
    out["error"] = str(exc).replace(str(root), "<root>")
world.close()
print(json.dumps(out))
"""

PROJECTOR_SCRIPT = PREAMBLE + r"""
import dagster as dg
from familiar_pipeline.config import ConfigError, load_config
from familiar_pipeline.defs.jobs import materialize_in_process
from familiar_pipeline.engine import registry
from familiar_pipeline.storage.snapshots import read_manifest
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog
from tests.helpers import make_familiar

paths = make_familiar(root, extra_toml='[providers.memory]\nprojectors = ["link_share"]\n'
                                       '[providers.memory.link_share]\nmax_per_turn = 1\n')
with TurnLog(paths.turns_db) as log:
    log.append_turn(channel_id=10, guild_id=1, role="user", author_key="discord:111", author_display="Cass",
                    content="the recipe: https://example.org/bread and https://example.org/more")
    log.append_turn(channel_id=10, guild_id=1, role="user", author_key="discord:222", author_display="Bo",
                    content="no link here")
    log.append_turn(channel_id=30, guild_id=None, role="user", author_key="discord:222", author_display="Bo",
                    content="see <https://example.com/x>")
with dg.instance_for_test() as instance:
    instance.add_dynamic_partitions("familiars", ["fam"])
    result = materialize_in_process(["shared_links"], instance=instance, data_root=root, partition_key="fam")
    meta = next(e.materialization.metadata for e in result.get_asset_materialization_events()
                if e.asset_key.path[-1] == "shared_links")
with ProjectionStore(paths.memory_db, read_only=True, tables=registry.tables()) as store:
    rows = [list(r) for r in store.table_rows("shared_links")]
    mark = store.get_watermark("link_share").turn_id
config = load_config("fam", root=root, env={})
out = {"success": result.success, "rows": rows, "watermark": mark,
       "served": read_manifest(paths.serving_dir).tables["shared_links"].rows,
       "rows_written": meta["rows_written"].value if "rows_written" in meta else None,
       "projectors": list(config.memory.projectors), "max_per_turn": config.memory.link_share.max_per_turn}
paths.character_toml.write_text('[providers.memory.link_share]\nmax_per_turn = 0\n')
try:
    load_config("fam", root=root, env={})
except ConfigError as exc:
    out["error"] = str(exc).replace(str(root), "<root>")
print(json.dumps(out))
"""


def test_a_new_prompt_layer_is_its_module_and_one_list(tmp_path):
    blocks = doc_blocks()
    module = "familiar_bot/prompt/layers/participants.py"
    assert module in blocks, "the doc shows the layer's whole module"
    doc = DOC.read_text(encoding="utf-8")
    assert "`participants,`" in doc and "`participants.SPEC,`" in doc, "the doc names the lines it adds"
    tree, changed = tree_with(tmp_path, {module: blocks[module]}, LAYER_LINES)
    assert changed == sorted([module, LAYER_LINES[0]])  # two files

    out = run_in(tree, tmp_path, LAYER_SCRIPT)
    names = out["layers"]
    assert names.index("participants") == names.index("reflection") + 1 == names.index("people_dossier") - 1
    assert out["order"] == names
    # The newest speaker first, while the section fits 8 tokens (text); the voice tier's 40 fits all three.
    assert out["text_section"] == "## Who is talking here\nBo, Cass"
    assert out["voice_section"] == "## Who is talking here\nBo, Cass, Mia"
    assert out["text_debug"] == {"keys": ["discord:222", "discord:111"], "tokens": out["text_debug"]["tokens"]}
    assert out["voice_debug"]["keys"] == ["discord:222", "discord:111", "discord:333"]
    assert out["budget"] == {"voice": 40, "text": 8, "background": 80}
    assert out["rendered"]
    assert out["other_order"] == ["participants", "recent_history"]
    assert out["other_prompt"] == "## Who is talking here\nMia"
    assert out["error"] == ("<root>/fam/character.toml: [budget.text].participants_tokens = 0 is invalid: "
                            "expected an integer >= 1")


def test_a_new_table_backed_projector_is_its_folder_and_one_list(tmp_path):
    blocks = doc_blocks()
    files = {name: blocks[name] for name in ("familiar_pipeline/projectors/links/__init__.py",
                                             "familiar_pipeline/projectors/links/spec.py")}
    doc = DOC.read_text(encoding="utf-8")
    assert "`from familiar_pipeline.projectors.links.spec import SPEC as LINKS`" in doc and "`LINKS,`" in doc
    tree, changed = tree_with(tmp_path, files, PROJECTOR_LINES)
    assert changed == sorted([*files, PROJECTOR_LINES[0]])  # three files

    out = run_in(tree, tmp_path, PROJECTOR_SCRIPT)
    assert out["success"] and out["watermark"] == 3
    assert out["rows"] == [[1, "https://example.org/bread", "discord:111", "guild:1"],
                           [3, "https://example.com/x", "discord:222", "channel:30"]]  # max_per_turn = 1
    assert out["served"] == 2 and out["rows_written"] == 2
    assert out["projectors"] == ["link_share"] and out["max_per_turn"] == 1
    assert out["error"] == ("<root>/fam/character.toml: [providers.memory.link_share].max_per_turn = 0 is invalid: "
                            "expected an integer >= 1")
