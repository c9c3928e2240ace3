"""Dagster only: assets, sensors, automation, checks, jobs, resources, partitions, backfill."""
