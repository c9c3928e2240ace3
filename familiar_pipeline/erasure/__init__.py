"""Forgetting on request: erased and deleted turns purged from every file the project writes.

`due`: which turns' text is due to go (and which projections must follow the turn log's
changes first); `purge`: the run step that removes every copy; `words`: the scrub of files
that cannot be rebuilt (run history, logs). The package sits below the engine, which calls it
and hands it the registered specs; it imports the engine for types only. The operator
command is `familiar_pipeline.forget`; docs/privacy.md says what is stored where.
"""
