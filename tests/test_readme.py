"""The README's recipes work: its commands exist and its notebook queries run."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from familiar_bot.cli.main import build_parser
from familiar_pipeline.defs.jobs import materialize_in_process

from .helpers import append_chat, make_familiar

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_every_familiar_subcommand_in_the_readme_exists():
    used = set(re.findall(r"uv run familiar ([a-z]+)", README))
    known = set(build_parser()._subparsers._group_actions[0].choices)
    assert used and used <= known, used - known


def test_notebook_recipes_run_against_a_real_familiar(tmp_path, monkeypatch):
    from familiar_pipeline.testing.fake_llm import install_fake_llm
    from familiar_pipeline.testing.scripted import careful_model

    install_fake_llm().script(careful_model)
    paths = make_familiar(tmp_path, "familiar")
    append_chat(paths, 20)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("familiars", ["familiar"])
        materialize_in_process(["facts"], instance=instance, data_root=tmp_path, partition_key="familiar")
    monkeypatch.chdir(tmp_path.parent)
    blocks = [b.replace("data/familiars/familiar", str(paths.dir)) for b in python_blocks()]
    store_block = next(b for b in blocks if "read_only=True" in b)
    namespace: dict = {}
    exec(store_block.replace("supersession_chain(42)", "supersession_chain(1)"), namespace)  # noqa: S102
    con = namespace["con"]
    assert con.execute("SELECT count(*) FROM current_facts").fetchall()[0][0] > 0
    con.close()
    snapshot_block = next(b for b in blocks if "manifest.json" in b)
    namespace = {}
    exec(snapshot_block, namespace)  # noqa: S102
    assert namespace["facts"].aggregate("count(*)").fetchall()[0][0] > 0


def documented_familiar_commands() -> list[list[str]]:
    """Every `uv run familiar ...` line of the README's and docs' bash blocks, as argv (env prefixes dropped)."""
    import shlex

    texts = [README] + [p.read_text() for p in sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md"))]
    found = []
    for text in texts:
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            for line in block.splitlines():
                if "uv run familiar " not in line or "[" in line.split("#")[0]:
                    continue  # a synopsis with [optional] parts is not a command
                found.append(shlex.split(line.split("uv run familiar ", 1)[1], comments=True))
    return found


def test_every_documented_familiar_command_parses():
    parser = build_parser()
    commands = documented_familiar_commands()
    assert len(commands) >= 10
    for argv in commands:
        parser.parse_args(argv)  # argparse exits (fails the test) on an unknown option or subcommand


def test_documented_minilm_command_finds_the_built_folder(minilm_dir, monkeypatch, capsys):
    from familiar_bot.cli.main import main

    [default_dir] = [argv for argv in documented_familiar_commands() if argv == ["models", "minilm"]]
    monkeypatch.setenv("FAMILIAR_MINILM_DIR", str(minilm_dir))
    assert main(default_dir) == 0
    assert capsys.readouterr().err.strip() == f"already built: {minilm_dir}"


def test_documented_eval_without_locomo_says_where_to_get_it(tmp_path, monkeypatch, capsys):
    from familiar_bot.cli.main import main

    monkeypatch.chdir(tmp_path)  # no locomo10.json here
    monkeypatch.delenv("FAMILIAR_LOCOMO", raising=False)
    evals = [argv for argv in documented_familiar_commands() if argv[:2] == ["eval", "locomo"]]
    assert evals
    for argv in evals:
        assert main(argv) == 2
        assert "github.com/snap-research/locomo" in capsys.readouterr().err
