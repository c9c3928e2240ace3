"""The familiar_pipeline code location: projections of every familiar's turn log."""

import dagster as dg

from familiar_pipeline.defs.assets import FACT_DRIVEN, MEMORY, turns
from familiar_pipeline.defs.jobs import plugin_assets, projection_job
from familiar_pipeline.defs.partitions import PROJECTION_QUEUE_TAG
from familiar_pipeline.defs.resources import EmbedderResource, FamiliarData, LlmResource
from familiar_pipeline.defs.sensors import build_turn_watermark_sensor
from familiar_pipeline.storage.private import use_private_umask

# The code server, the run worker and every run load this module: what they write (stores,
# snapshots, indexes, the LLM cache) is private even under a `dagster dev` started by hand.
use_private_umask()

PLUGIN_ASSETS = plugin_assets()
# A plugin asset that follows facts carries the same automation condition as the built-in followers.
PLUGIN_FOLLOWERS = [a for a in PLUGIN_ASSETS if any(a.automation_conditions_by_key.values())]

# The fact-driven assets carry automation conditions (they follow `facts`, per
# partition); this sensor evaluates them. RUNNING by default so nothing needs
# enabling by hand in the UI.
fact_automation_sensor = dg.AutomationConditionSensorDefinition(
    "fact_automation_sensor",
    target=dg.AssetSelection.assets(*FACT_DRIVEN, *PLUGIN_FOLLOWERS),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    run_tags=PROJECTION_QUEUE_TAG,  # its runs may cover many familiars: queued behind the turn sensor's
    description=(
        "Runs fact_supersessions, people_dossiers, reflections and fact_embeddings for a familiar after its "
        "facts (or supersessions) changed; each one then processes only what is past its own watermark."
    ),
)

PROJECTION_ASSETS = [MEMORY, *PLUGIN_ASSETS]

defs = dg.Definitions(
    assets=[turns, *PROJECTION_ASSETS],
    jobs=[projection_job],
    sensors=[build_turn_watermark_sensor(PROJECTION_ASSETS), fact_automation_sensor],
    resources={"familiar_data": FamiliarData(), "llm": LlmResource(), "embedder": EmbedderResource()},
    # One process per run: a plugin's step shares the familiar's DuckDB file with the built-ins' step.
    executor=dg.in_process_executor,
)
