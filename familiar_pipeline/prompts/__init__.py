"""Prompt builders and their parsers, one small module per projector.

Every prompt carries untrusted chat text. It is always rendered as JSON string
literals (one per line), so a message can never break out of its line to fake
another turn, a participant, or an instruction.
"""
