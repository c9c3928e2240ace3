"""The `familiar` command line."""
