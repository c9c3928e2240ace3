"""Evaluation on LoCoMo through the bot's own retrieval."""
