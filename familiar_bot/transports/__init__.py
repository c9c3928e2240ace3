"""Where messages come from: the console and Discord."""
