"""The familiar_pipeline code location: projections of every familiar's turn log."""

import dagster as dg

from familiar_pipeline.assets import TURN_DRIVEN_ASSETS, turns
from familiar_pipeline.checks import ALL_CHECKS
from familiar_pipeline.jobs import plugin_assets, projection_job
from familiar_pipeline.resources import FamiliarData, LlmResource
from familiar_pipeline.sensors import build_turn_watermark_sensor

defs = dg.Definitions(
    assets=[turns, *TURN_DRIVEN_ASSETS, *plugin_assets()],
    asset_checks=ALL_CHECKS,
    jobs=[projection_job],
    sensors=[build_turn_watermark_sensor(TURN_DRIVEN_ASSETS)],
    resources={"familiar_data": FamiliarData(), "llm": LlmResource()},
    # One process per run: every step of a run shares the familiar's DuckDB file, which allows one writer.
    executor=dg.in_process_executor,
)
