"""notebooks/facts.ipynb runs headless (nbclient + ipykernel, no server, no network) on a familiar built here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dagster as dg
import nbformat
from nbclient import NotebookClient

from tests.fact_helpers import familiar, materialize
from tests.helpers import append_chat

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "facts.ipynb"


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

    # Relative to the repository root, as a user writes it, while the kernel starts elsewhere (Jupyter
    # starts it in notebooks/; here a folder of its own).
    monkeypatch.setenv("FAMILIAR_NOTEBOOK_DIR", os.path.relpath(paths.dir, REPO))
    monkeypatch.setenv("FAMILIAR_NOTEBOOK_AS_OF", "2030-01-01T00:00:00+00:00")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    kernel_dir = tmp_path / "notebooks"
    kernel_dir.mkdir()
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(kernel_dir)}}).execute()

    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    setup, current, as_of, chain, said, snapshot = (text_of(c) for c in code)
    assert "facts" in setup and str(paths.dir.resolve()) in str(Path(setup.split()[0]).resolve())
    assert "Cass said:" in current
    assert "valid at 2030-01-01" in as_of
    assert "supersession" in chain.lower() or "id" in chain  # a table came back
    assert "Cass" in said and "bakery" in said  # fact joined with the turn that said it
    assert "snapshot version" in snapshot


def test_without_memory_the_notebook_names_the_full_path_it_looked_for(tmp_path, monkeypatch):
    """The default familiar's folder, read from the repository root whatever the kernel's folder."""
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("FAMILIAR_NOTEBOOK_DIR", "data/familiars/no-such-familiar-here")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.raises(CellExecutionError) as failed:
        NotebookClient(notebook, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert f"{REPO / 'data/familiars/no-such-familiar-here/memory.duckdb'} does not exist" in str(failed.value)
