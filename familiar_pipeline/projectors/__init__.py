"""Projection logic as plain functions: read turns, call the model, decide, write.

One folder per projector (`facts/`, `supersede/`, `dossiers/`, ...), each with its
`spec.py` (`spec.py` here says what a spec declares; `registry.py` lists them), its run
logic, its prompt and reply model, its table declarations and their SQL, and its
scripted answers. The assets in `familiar_pipeline.defs.assets` are thin shells built
from the specs; tests call the functions directly.
"""
