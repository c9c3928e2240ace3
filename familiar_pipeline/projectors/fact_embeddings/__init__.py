"""Fact embeddings (projector `fact_embedding`, opt-in): a vector per current fact for the active model.

`spec.py` (knobs, asset), `run.py` (embedding in batches), `tables.py` (`fact_embeddings`,
its SQL and its snapshot reads).
"""
