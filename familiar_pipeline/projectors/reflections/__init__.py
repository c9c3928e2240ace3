"""Reflections (projector `reflection`, asset `reflections`): cited syntheses over windows of turns.

`spec.py` (knobs, asset, invariant), `run.py` (windows, citations kept), `prompt.py` (the
prompt and its reply model), `tables.py` (the `reflections` table, its SQL and snapshot
reads), `scripted.py` (the scripted offline model's answer).
"""
