"""Projection logic as plain functions: read turns, call the model, decide, write.

One module per projector, each ending with its `SPEC` (`spec.py` says what a spec
declares; `registry.py` lists them). The assets in `familiar_pipeline.defs.assets`
are thin shells built from the specs; tests call the functions directly.
"""
