"""People dossiers (projector `people_dossier`, asset `people_dossiers`): one compounding dossier per subject.

`spec.py` (knobs, asset, invariant), `run.py` (steps along the extraction batches, folds),
`prompt.py` (the person and self-record prompts), `tables.py` (the `people_dossiers`
table, its SQL and snapshot reads), `scripted.py` (the scripted offline model's answer).
"""
