"""`familiar prompt`: show the prompt a message would get, section by section, without sending it.

The operator's answer to "why did it say that?": the same assembly the responder
runs, with the given text as the retrieval cue, rendered with token counts per
layer and the fact ranking signals. Nothing is written: no turn, no reply.
"""

from __future__ import annotations

import argparse

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command, require_familiar
from familiar_pipeline.config import BUDGET_TIERS, load_config


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", required=True, metavar="ID", help="familiar id")
    parser.add_argument("--channel", required=True, type=int, metavar="N",
                        help="channel id whose history, summary and overrides to use")
    parser.add_argument("--guild", type=int, metavar="ID",
                        help="guild id, for guild nicknames (default: none)")
    parser.add_argument("--tier", default="text", choices=[t for t in BUDGET_TIERS if t != "background"],
                        help="budget tier (default text)")
    parser.add_argument("message", help="the message to assemble a prompt for (the retrieval cue)")


def run(args: argparse.Namespace) -> int:
    from familiar_bot.prompt.assembly import AssemblyContext, build_assembler, render_sections
    from familiar_bot.prompt.memory_view import MemoryView
    from familiar_pipeline.models.embedders import create_embedder
    from familiar_pipeline.storage.turns import TurnLog, TurnLogError

    familiar = require_familiar(args.familiar)
    for flag, value in (("--channel", args.channel), ("--guild", args.guild)):
        if value is not None and not 0 < value < 2**63:
            raise CliError(f"{flag} must be a positive integer below 2^63, got {value}", EXIT_CONFIG)
    config = load_config(args.familiar)
    # Read-only: inspecting must never write, nor wait on the running bot's writes.
    try:
        turn_log = TurnLog(familiar.turns_db, readonly=True)
    except TurnLogError as exc:
        raise CliError(str(exc)) from None
    memory = MemoryView(familiar, config, embedder=create_embedder(config.embedding), turn_log=turn_log)
    try:
        prompt = build_assembler(familiar, config, memory=memory).assemble(AssemblyContext(
            familiar_id=args.familiar, channel_id=args.channel, guild_id=args.guild,
            tier=args.tier, cue=args.message,
        ))
    finally:
        memory.close()
        turn_log.close()
    print(render_sections(prompt))
    return 0


COMMAND = Command("prompt", "show the prompt sections (with token counts) a message would be answered "
                  "with, without sending or recording anything", configure, run)
