"""Context-window vectors (projector `turn_window_embedding`, opt-in): each live turn embedded together
with its nearest same-channel turns.

`spec.py` (knobs, asset), `run.py` (which windows a new, edited or deleted turn touches),
`tables.py` (`turn_window_embeddings` and the blended turn matrix a reply searches).
"""
