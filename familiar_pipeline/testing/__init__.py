"""Scripted offline models (importable by run processes, so a test can drive a real Dagster run)."""
