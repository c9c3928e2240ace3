"""familiar's bot side: Discord and console transports, prompt assembly, the CLI."""
