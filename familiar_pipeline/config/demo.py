"""The offline demo's settings, which apply to the demo familiar alone.

`familiar up --demo` runs one familiar (``familiar``, the default familiar of every
command, unless ``--familiar`` names another) on the scripted offline model, with small batches so memory shows within a
minute. Those settings used to be process-wide ``FAMILIAR__...`` variables, so every
familiar the Dagster processes saw got the scripted model and the demo's batch sizes:
a rebuild of another familiar wrote scripted facts into it. Now the demo names its
familiar in ``FAMILIAR_DEMO`` and `load_config` applies `DEMO_SETTINGS` when it loads
that familiar only (after its files, before ``FAMILIAR__`` overrides, each leaf's
source shown as "familiar up --demo"). Nothing is written to any file.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from familiar_pipeline.config.schema import DEFAULT_FAMILIAR_ID

# One name everywhere (README, `familiar up`, `chat`, the notebook, .env.example): a newcomer's
# demo familiar is the one every later command opens by default.
DEMO_FAMILIAR = DEFAULT_FAMILIAR_ID
DEMO_FAMILIAR_ENV = "FAMILIAR_DEMO"

# Both model slots on the scripted model (no retries: a scripted fault shows at once), and
# small batches: a batch every 4 turns or a 20 s pause, every batch folded into the dossiers.
DEMO_SETTINGS: dict[tuple[str, ...], Any] = {
    ("llm", "reply", "model"): "fake/demo-reply",
    ("llm", "background", "model"): "fake/careful",
    ("llm", "background", "max_retries"): 0,
    ("providers", "memory", "rich_note", "batch_size"): 4,
    ("providers", "memory", "rich_note", "quiet_s"): 20,
    ("providers", "memory", "people_dossier", "batches_per_fold"): 1,
    ("providers", "memory", "people_dossier", "fold_min_weight"): 0,
    ("providers", "memory", "rolling_summary", "turns_threshold"): 4,
    ("providers", "memory", "reflection", "turns_threshold"): 8,
}


def demo_settings(familiar_id: str, env: Mapping[str, str]) -> Iterator[tuple[str, tuple[str, ...], Any]]:
    """(source, key path, value) of the demo's settings, if `familiar_id` is the demo familiar in `env`."""
    if familiar_id and env.get(DEMO_FAMILIAR_ENV) == familiar_id:
        for path, value in DEMO_SETTINGS.items():
            yield f"familiar up --demo ({DEMO_FAMILIAR_ENV}={familiar_id})", path, value
