"""familiar's application: what drives the bot and the pipeline together.

The `familiar` command (`cli/`), the evaluators (`eval/`: LoCoMo, the updates benchmark's chats)
and the `familiar up` process supervisor (`supervisor.py`) sit above both sides: they may import
the bot runtime (the rest of `familiar_bot`) and any of `familiar_pipeline`, and nothing imports
them back (tests/test_architecture.py).
"""
