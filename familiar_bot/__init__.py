"""familiar's bot side: Discord and console transports, prompt assembly; `app/` above it (the CLI, evaluation, the supervisor)."""
