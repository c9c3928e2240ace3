"""Projection logic as plain functions: read turns, call the model, decide, write.

Each module here is one projector. Assets in `familiar_pipeline.defs.assets` are thin
shells around these functions; tests call them directly.
"""
