"""The turn full-text index (`turns_fts`): new turns added, edited turns re-indexed, deleted ones removed.

`spec.py` (the asset; always on), `run.py` (the index pass and `search_text`, what a turn
is found by, shared with the turn vectors).
"""
