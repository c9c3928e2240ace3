"""What a channel is told instead of a reply.

A missing reply model, a failed model call, a turn log that cannot take a message: each gets a
short notice in the channel. Notices are not the familiar speaking, so they are never recorded
as its turns, and they never name a server path (:func:`public_text`).
"""

from __future__ import annotations

from familiar_pipeline.storage.paths import FamiliarPaths

APOLOGY = "Sorry, I couldn't put a reply together just now. Please try again in a moment."


def not_configured_notice(paths: FamiliarPaths, detail: str | None = None) -> str:
    """What to tell a channel when no reply model can be called, and how to fix it.

    It goes to the channel, so it names the file as the operator knows it (the
    familiar's character.toml), never the server's absolute path (`public_text`).
    """
    if detail:
        return public_text(f"I can't reply yet: {detail}", paths)
    return (
        "I can't reply yet: no reply model is configured. I'm still listening and remembering. "
        f"To let me answer, set [llm.reply].model in the character.toml of familiar '{paths.familiar_id}' "
        "(a litellm model string such as \"openrouter/anthropic/claude-sonnet-4\"), or the environment "
        "variable FAMILIAR__LLM__REPLY__MODEL, then restart me."
    )


def public_text(text: str, paths: FamiliarPaths) -> str:
    """`text` without the server's paths: the familiar's folder and the data root become names.

    Anything said in a channel is read by people who have no business knowing where
    the bot keeps its files on the server.
    """
    for path, shown in ((paths.dir, f"<familiar {paths.familiar_id}>"), (paths.root, "<data root>")):
        text = text.replace(str(path), shown)
    return text


def spooled_notice(waiting: int) -> str:
    return ("I couldn't take that message in: my memory can't be written right now (the disk is full or "
            f"failing). I'm holding on to it ({waiting} waiting) and will store it as soon as I can; "
            "no need to send it again.")


def refused_notice(waiting: int) -> str:
    return ("I couldn't take that message in: my memory can't be written right now (the disk is full or "
            f"failing), and I'm already holding {waiting} messages for it. This one was not kept: please "
            "send it again later.")
