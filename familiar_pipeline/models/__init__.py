"""Model clients: the LLM client and its cache, embedders, the offline MiniLM folder, tolerant JSON."""
