"""Passage vectors (projector `turn_passage_embedding`, opt-in): a vector per passage of each long live turn.

`spec.py` (knobs, asset), `run.py` (new long turns cut and embedded, edits re-embedded, deletions
removed; the run is `run_turn_vectors`, shared with the turn and window vectors), `tables.py`
(`turn_passage_embeddings` and the passage matrix a reply searches). Where a turn is cut:
`familiar_pipeline.storage.passages`, the same cut the prompt shows a long turn by.
"""
