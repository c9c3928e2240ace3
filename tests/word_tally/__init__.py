"""A third-party projector that keeps rows of its own: words said per speaker, per batch of turns.

The worked example of a table-backed projector: everything it is lives in this folder
(`spec.py`, `run.py`, `tables.py`), and one line registers it (below), loaded through
`FAMILIAR_PLUGINS=tests.word_tally` exactly as the code location loads any plugin. Its
table is created and migrated by the store, published in the serving snapshot, read
back through the snapshot reader, dropped by a rebuild and covered by the provenance
checks, all from its declaration; nothing outside this folder names it.
"""

from familiar_pipeline.engine.registry import register_projector

from .spec import SPEC

register_projector(SPEC)
