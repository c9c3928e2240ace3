"""Standing wishes (projector `standing_wish`, asset `wishes`): what people asked the familiar to keep doing.

`detect.py` (the heuristic: which sentences are wishes, and on what point), `spec.py` (knobs,
asset, invariant), `run.py` (new, edited and deleted turns; retirement by point), `tables.py`
(the `wishes` table, `WishView`, its SQL and snapshot reads). No model: it runs wherever the
familiar runs, and the bot pins the current wishes of whoever speaks (`standing_wishes` layer).
"""
