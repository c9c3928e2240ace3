"""Turn embeddings (projector `turn_embedding`, opt-in): a vector per live turn for the active model.

`spec.py` (knobs, asset), `run.py` (new turns embedded, edits re-embedded, deletions removed;
`run_turn_vectors`, shared with the context windows), `tables.py` (`turn_embeddings` and the
turn matrix a reply searches).
"""
