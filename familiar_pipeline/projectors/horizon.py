"""Where the fact log stood at a point of the turn log: what keeps fact-driven projections replayable.

Dossiers and reflections read facts, and facts change under them (new ones are
extracted, old ones retired). For an incremental build and a rebuild from
scratch to send the same prompts, what a projection sees at each step must be a
function of the logs, not of how far the other assets happened to have run.
Two rules give that:

* The fact horizon at turn T is the highest fact id whose source turns are all
  at or before T. Extraction batches are consecutive runs of turns and fact ids
  grow batch by batch, so this is exactly "the facts extracted from turns up to
  T", whenever it is asked.
* A fact is current at horizon H when it is not retired, or when the fact that
  retired it is newer than H. Supersession evaluates new facts oldest first and
  only ever lets a newer fact retire an older one, so this reproduces which
  facts were current right after the fact with id H was evaluated.

Facts written outside the extraction batches (no source turns) count from the
first horizon past their id.

The reads along the fact axis are store methods (``fact_horizon``,
``facts_in_range``, ``fact_ids_for_subject``, ``facts_retired_between``,
``facts_current_at_horizon``, whose SQL is the rule of :func:`current_at`).
"""

from __future__ import annotations

from familiar_pipeline.projectors.facts.tables import Fact


def current_at(fact: Fact, horizon: int) -> bool:
    """Not retired as of the moment facts up to `horizon` had been evaluated.

    A plain retire (no replacement id) has no position on the fact axis, so it
    counts as retired at every horizon.
    """
    if fact.superseded_at is None:
        return True
    return fact.superseded_by is not None and fact.superseded_by > horizon
