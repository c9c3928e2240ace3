"""Retrieval for ``rag_context``: the hub and what it runs (facts, earlier turns, their re-rankers, the render).

``hub.retrieve`` is the entry point (``layers/rag_context.py`` and the evaluators). In the
order a reply meets them: ``hub``; ``facts``; ``turns`` with ``turn_vectors`` (the cue's
cosines) and ``ranking`` (the fusion both share, pure); ``rerank``, the steps after fusion,
and the re-rankers it calls: ``turn_signals`` (with ``cue_people`` and ``cue_time``),
``genre``, ``substance``, ``threads``, ``spread``; ``passages`` (a long turn shown in part);
``render``. Each module's docstring says what it decides and why it stands apart.
"""
