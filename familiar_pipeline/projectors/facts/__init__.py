"""Fact extraction (projector `rich_note`, asset `facts`): atomic, attributed facts from batches of turns.

`spec.py` declares it (knobs, asset, drop rule, invariants); `batches.py` cuts the
turn log into batches; `run.py` extracts; `prompt.py` is the prompt with its reply
model; `tables.py` declares `facts` and `fact_subjects` with their records and
`FactView`; `store.py` is their SQL, `reads.py` their reads over a serving snapshot;
`scripted.py` answers the prompt for the scripted offline model. Nothing is imported
here, so the bot can import `tables`/`reads` without the extraction code.
"""
