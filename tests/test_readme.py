"""The README and the docs it points to: every command the README shows is run by a test, its links land,
it stays short, and the docs' commands and notebook queries work."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from familiar_bot.app.cli.main import build_parser
from familiar_pipeline.defs.jobs import materialize_in_process

from .helpers import append_chat, make_familiar

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
# The DuckDB and snapshot recipes, moved out of the README with the rest of its reference text.
MEMORY_DOC = (REPO / "docs" / "memory.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", MEMORY_DOC, re.S)


def test_every_familiar_subcommand_in_the_readme_and_docs_exists():
    docs = "\n".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    used = set(re.findall(r"uv run familiar ([a-z]+)", README + docs))
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
    from familiar_bot.app.cli.main import main

    [default_dir] = [argv for argv in documented_familiar_commands() if argv == ["models", "minilm"]]
    monkeypatch.setenv("FAMILIAR_MINILM_DIR", str(minilm_dir))
    assert main(default_dir) == 0
    assert capsys.readouterr().err.strip() == f"already built: {minilm_dir}"


def test_documented_eval_without_locomo_says_where_to_get_it(tmp_path, monkeypatch, capsys):
    from familiar_bot.app.cli.main import main

    monkeypatch.chdir(tmp_path)  # no locomo10.json here
    monkeypatch.delenv("FAMILIAR_LOCOMO", raising=False)
    evals = [argv for argv in documented_familiar_commands() if argv[:2] == ["eval", "locomo"]]
    assert evals
    for argv in evals:
        assert main(argv) == 2
        assert "github.com/snap-research/locomo" in capsys.readouterr().err


# --------------------------------------------------------------------------- the README itself (issue 50 item 7)


def test_the_readme_starts_small():
    assert len(README.splitlines()) <= 200


def readme_commands() -> list[str]:
    """Every command the README shows: each line of its shell blocks (comments and blank lines dropped,
    `&&` chains kept whole), and every inline `uv run ...` span."""
    found = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", README, re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                found.append(command)
    found += re.findall(r"`(uv run [^`]+)`", README)
    return found


# Commands that run here, in process, as the README shows them (after `uv run `).
RUN_HERE = {"uv run familiar --help": ["--help"]}
# Commands too heavy to run here, each with the places that run it exactly so: (file, text it holds).
# The suite cannot run itself, `pip install` changes the machine, `familiar up --demo` is a real
# process group: each is run where named.
RUN_ELSEWHERE = {
    "python3 -m pip install uv && uv run familiar up --demo": [
        (".ci/run", "python3 -m pip install --quiet uv"),  # CI installs uv the same way on a bare Python
        ("tests/test_up.py", '"up", "--demo"'),  # a real `familiar up --demo`: UI ready, chat, replies
        ("tests/test_reliability_heal.py", '"up", "--demo"'),  # ... and its daemon killed and restarted
    ],
    "uv run pytest": [(".ci/run", "uv run --frozen pytest")],  # CI runs the README's test command
    "uv run familiar backfill --familiar familiar --projection facts --rebuild": [
        ("docs/playbook.md", "uv run familiar backfill --familiar familiar --projection facts --rebuild"),
        ("tests/test_playbook.py", '"--projection facts" in ln'),  # runs that playbook line through main()
    ],
    "uv run mkdocs build --strict": [
        (".ci/run", "uv run --frozen mkdocs build --strict"),
        ("tests/test_docs_site.py", '"mkdocs", "build", "--strict"'),  # the same build, into a temporary folder
    ],
}


def test_every_command_the_readme_shows_is_run_by_a_test(capsys):
    from familiar_bot.app.cli.main import main

    commands = readme_commands()
    assert "uv run pytest" in commands and "python3 -m pip install uv && uv run familiar up --demo" in commands
    unaccounted = [c for c in commands if c not in RUN_HERE and c not in RUN_ELSEWHERE]
    assert unaccounted == [], "a README command no test runs: add it to RUN_HERE or RUN_ELSEWHERE"
    for command in commands:
        if command in RUN_HERE:
            assert main(RUN_HERE[command]) == 0, command
            assert "usage: familiar" in capsys.readouterr().out
        for path, needle in RUN_ELSEWHERE.get(command, []):
            assert needle in (REPO / path).read_text(), (command, path, needle)


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs make it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_link_of_the_readme_lands_on_a_file_and_heading():
    broken = []
    for target in re.findall(r"\]\(([^)]+)\)", README):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if not (REPO / path).exists():
            broken.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", (REPO / path).read_text(), re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert broken == []
