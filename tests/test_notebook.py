"""notebooks/facts.ipynb runs headless (nbclient + ipykernel, no server, no network) on a familiar built here."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import nbformat
from nbclient import NotebookClient

from tests.fact_helpers import familiar, materialize
from tests.helpers import append_chat

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "facts.ipynb"


def text_of(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_facts_notebook_executes_against_a_small_familiar(tmp_path, monkeypatch):
    root = tmp_path / "familiars"
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(root))
    monkeypatch.setenv("FAMILIAR_FAKE_LLM", "familiar_pipeline.testing.scripted:careful_model")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    paths = familiar(root, "nb")
    append_chat(paths, 20)
    with dg.instance_for_test() as instance:
        materialize(root, instance, ["facts", "fact_supersessions"], familiar_id="nb")

    monkeypatch.setenv("FAMILIAR_NOTEBOOK_DIR", str(paths.dir))
    monkeypatch.setenv("FAMILIAR_NOTEBOOK_AS_OF", "2030-01-01T00:00:00+00:00")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    setup, current, as_of, chain, said, snapshot = (text_of(c) for c in code)
    assert "facts" in setup and str(paths.dir) in setup
    assert "Cass said:" in current
    assert "valid at 2030-01-01" in as_of
    assert "supersession" in chain.lower() or "id" in chain  # a table came back
    assert "Cass" in said and "bakery" in said  # fact joined with the turn that said it
    assert "snapshot version" in snapshot
