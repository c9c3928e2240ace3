"""`familiar bot`: run a familiar on Discord."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command, require_familiar
from familiar_pipeline.config import load_config

INTERRUPTED = 130
NO_TOKEN = (
    "DISCORD_TOKEN is not set: export the bot token from the Discord developer portal "
    "(or put it in the .env file at the repository root: see .env.example) before `familiar bot`; "
    "without one, talk locally with `familiar chat`"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", metavar="ID", help="familiar id (default: $FAMILIAR_ID, else 'familiar')")
    parser.add_argument("--members-intent", action="store_true",
                        help="also request the privileged Server Members intent (switch it on in the "
                             "developer portal first) to track nickname changes as they happen")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level on stderr (default INFO)")


def run(args: argparse.Namespace) -> int:
    import discord

    from familiar_bot.transports.discord_adapter import serve
    from familiar_bot.responder.opening import open_responder

    from familiar_bot.app.cli.commands.chat import refuse_scripted_models

    config = load_config(args.familiar)
    refuse_scripted_models(config, config.familiar_id)
    token = config.secrets.discord_token
    if not token:
        raise CliError(NO_TOKEN, EXIT_CONFIG)
    familiar = require_familiar(config.familiar_id)
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not config.llm.slot("reply").configured:
        logging.getLogger(__name__).warning(
            "no reply model configured for %s: the bot will record turns and say so once per channel; "
            "set [llm.reply].model in %s", config.familiar_id, familiar.character_toml)
    handle = open_responder(familiar, config)
    try:
        asyncio.run(serve(handle.responder, token, members_intent=args.members_intent))
    except discord.LoginFailure:
        raise CliError("Discord rejected DISCORD_TOKEN (login failed); copy the bot token again from "
                       "the developer portal") from None
    except discord.PrivilegedIntentsRequired:
        wanted = "Message Content" + (" and Server Members" if args.members_intent else "")
        raise CliError(f"Discord refused the privileged {wanted} intent: switch it on under Bot > "
                       "Privileged Gateway Intents in the developer portal") from None
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        handle.close()
    return 0


COMMAND = Command("bot", "run a familiar on Discord (needs DISCORD_TOKEN; see also `familiar chat`)",
                  configure, run)
