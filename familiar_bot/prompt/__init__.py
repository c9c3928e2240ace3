"""Prompt assembly: the assembler, its layers, the memory view over the snapshots, retrieval, lorebook, tokens."""
