"""The storage kernel the bot shares: turn log, projection store, full-text indexes, serving snapshots, paths."""
