"""`familiar chat`: talk to a familiar in the terminal, no Discord needed."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import sys

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command, init_familiar, require_familiar
from familiar_pipeline.storage import paths
from familiar_pipeline.config import DEFAULT_FAMILIAR_ID, load_config

INTERRUPTED = 130


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", metavar="ID",
                        help="familiar id (default: $FAMILIAR_ID, else 'familiar'); must exist "
                             "(`familiar init`), except the first one on an empty data root, which is "
                             "created from the defaults")
    parser.add_argument("--as", dest="speaker", metavar="NAME",
                        help="who you are in the conversation (default: the name you gave on first start, "
                             "asked once per familiar; your login name when input is not a "
                             "terminal); recorded as the participant console:<name>")
    parser.add_argument("--channel", type=int, default=None, metavar="N",
                        help="channel number the turns are recorded under (default 1); use different "
                             "numbers for separate conversations")


def familiar_id_from(args: argparse.Namespace) -> str:
    familiar_id = args.familiar or os.environ.get("FAMILIAR_ID") or DEFAULT_FAMILIAR_ID
    return paths.validate_familiar_id(familiar_id)


def ensure_familiar(familiar_id: str, *, create: bool = False) -> bool:
    """The familiar to talk to; created from the defaults only where it cannot be a typo. True if created.

    A familiar that does not exist is created when `create` is set (`--demo` creates its
    own), or when the data root has no familiar at all yet (the first start on a fresh
    clone). Otherwise it is refused exactly as `facts`, `import` and the others refuse
    it (`require_familiar`: near names, and `familiar init` to create it on purpose).
    """
    familiar = paths.FamiliarPaths.for_id(familiar_id)
    if familiar.character_toml.exists() or familiar.turns_db.exists():
        return False
    if not create and paths.list_familiars(familiar.root):
        require_familiar(familiar_id)  # raises
    for line in init_familiar(familiar_id):
        print(line, file=sys.stderr)
    return True


def check_channel(channel: int | None) -> int:
    from familiar_bot.transports.console import DEFAULT_CONSOLE_CHANNEL

    if channel is None:
        return DEFAULT_CONSOLE_CHANNEL
    if not 0 < channel < 2**63:
        raise CliError(f"--channel must be a positive integer below 2^63, got {channel}", EXIT_CONFIG)
    return channel


def check_speaker(name: str | None) -> None:
    """Refuse an unusable --as before anything is created."""
    from familiar_bot.transports.console import console_person

    if name is not None:
        try:
            console_person(name)
        except ValueError as exc:
            raise CliError(f"--as: {exc}", EXIT_CONFIG) from None


def refuse_scripted_models(config, familiar_id: str) -> None:
    """A `fake/` model outside the demo is a mistake: refuse it with one line naming the flag.

    The scripted models run only where FAMILIAR_FAKE_LLM names their script: in tests, and
    in `familiar up --demo`, which sets it (and the models) for its own processes only.
    """
    from familiar_pipeline.testing.fake_llm import FAKE_LLM_ENV

    if os.environ.get(FAKE_LLM_ENV):
        return
    for name, slot in sorted(config.llm.slots.items()):
        if slot.model.startswith("fake/"):
            where = paths.FamiliarPaths.for_id(familiar_id).character_toml
            raise CliError(f"[llm.{name}].model = {slot.model!r} is the scripted offline model, which runs only "
                           f"under `familiar up --demo`; use that flag, or set a real model ({where})", EXIT_CONFIG)


def run(args: argparse.Namespace) -> int:
    from familiar_bot.transports.console import TerminalState, resolve_speaker, run_console
    from familiar_bot.responder.opening import open_responder

    familiar_id = familiar_id_from(args)
    channel = check_channel(args.channel)
    check_speaker(args.speaker)
    if ensure_familiar(familiar_id):
        print(f"created familiar {familiar_id!r} from the defaults", file=sys.stderr)
    config = load_config(familiar_id)
    refuse_scripted_models(config, familiar_id)
    speaker = resolve_speaker(paths.FamiliarPaths.for_id(familiar_id).dir, args.speaker, fallback=_login_name())
    if speaker is None:  # end of input before a name was given
        return 0
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
    handle = open_responder(paths.FamiliarPaths.for_id(familiar_id), config)
    terminal = TerminalState.save()
    try:
        return asyncio.run(run_console(handle.responder, speaker=speaker, channel_id=channel))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return INTERRUPTED
    finally:
        handle.close()
        terminal.restore()


def _login_name() -> str:
    try:
        return getpass.getuser() or "you"
    except (KeyError, OSError):  # no passwd entry, e.g. in a container
        return "you"


COMMAND = Command("chat", "talk to a familiar in this terminal (reads lines from standard input)",
                  configure, run)
