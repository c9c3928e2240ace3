"""The storage kernel the bot shares: turn log, projection store, full-text indexes, serving snapshots, paths.

It sits on config's ground floor (`storage.paths` builds a familiar's file paths on `config.places`)
and knows no projector.
"""
