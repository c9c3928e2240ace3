"""Forgetting on request: erased and deleted turns purged from every file the project writes.

`due`: which turns' text is due to go; `purge`: the run step that removes every copy;
`words`: the scrub of files that cannot be rebuilt (run history, logs). The operator
command is `familiar_pipeline.forget`; docs/privacy.md says what is stored where.
"""
