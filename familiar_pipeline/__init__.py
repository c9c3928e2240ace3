"""familiar's memory: the Dagster code location and the storage layer.

`turns.db` (SQLite, written by the bot) is the source of truth; everything in
`memory.duckdb`, the Parquet serving snapshots and the tantivy indexes is a
projection that Dagster materializes and can drop and rebuild.
"""
