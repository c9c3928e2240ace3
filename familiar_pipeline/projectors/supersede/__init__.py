"""Fact supersession (projector `fact_supersede`, asset `fact_supersessions`): newer facts retire
the earlier facts they contradict.

`spec.py` (knobs, asset, invariants), `run.py` (groups, pools, decisions), `prompt.py` (the
prompt and its reply model), `tables.py` (the `supersede_decisions` log and the retirement
writes on `facts`), `scripted.py` (the scripted offline model's judgement).
"""
