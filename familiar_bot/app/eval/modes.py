"""The evaluation's modes, apart from the harness so the CLI can list them without importing Dagster."""

EMBEDDER_MODES = ("hash", "fastembed", "off")
FACT_MODES = ("none", "extracted", "gold")
