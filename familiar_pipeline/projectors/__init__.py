"""Projection logic as plain functions: read turns, call the model, decide, write.

One folder per projector (`facts/`, `supersede/`, `dossiers/`, ...), each with its
`spec.py` (`familiar_pipeline.engine.spec` says what a spec declares), its run logic,
its prompt and reply model, its table declarations and their SQL, and its scripted
answers; `builtin.py` registers the built-ins with the engine, in run order. Beside the
folders, the helpers several projectors share: `prompting.py` (prompt rendering),
`vectors.py` (the embedding projectors' spec, rows and reads) and `horizon.py` (the facts
as they stood at a turn). The engine (`familiar_pipeline.engine`) runs them; the assets
in `familiar_pipeline.defs.assets` are thin shells built from the specs; tests call the
functions directly.
"""
