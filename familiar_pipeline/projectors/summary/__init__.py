"""The rolling summary (projector `rolling_summary`): one compounding summary of the conversation.

`spec.py` (knobs, asset), `run.py` (the folds), `prompt.py` (the prompt and its reply),
`tables.py` (the `summaries` table, its SQL and its snapshot read), `scripted.py` (the
scripted offline model's answer).
"""
