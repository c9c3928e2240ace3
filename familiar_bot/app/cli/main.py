"""The `familiar` command line.

Subcommands come from the `COMMANDS` table: each entry names a command, says
what it is for, adds its arguments to its own parser, and runs. Later work adds
`up`, `chat`, `backfill`, `eval`, `bench`, `import`, `facts` and `prompt` by
appending entries, without touching `main`.

Operator mistakes (bad config, bad familiar id, refusing to overwrite) print one
`error: ...` line on stderr and return a non-zero code; a traceback is kept for
bugs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, MutableMapping, Sequence

from familiar_pipeline.storage import paths
from familiar_pipeline.storage.private import private_dir, use_private_umask
from familiar_pipeline.config import ConfigError, load_config, render_config

EXIT_REFUSED = 1
EXIT_CONFIG = 2
# The .env file `familiar` reads: the repository root's unless this names another ("" reads none;
# the test suite sets it so a developer's own .env never leaks into a test).
ENV_FILE_VAR = "FAMILIAR_ENV_FILE"


class CliError(Exception):
    """An operator-facing failure: printed as one line, exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_REFUSED):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --------------------------------------------------------------------------- init


def default_alias(familiar_id: str) -> str:
    """`"sapphire"` -> `"Sapphire"`, `"night-owl"` -> `"Night Owl"`."""
    return familiar_id.replace("-", " ").replace("_", " ").title()


def override_toml(familiar_id: str, alias: str) -> str:
    """A new familiar's character.toml: its name, plus commented hints of common knobs."""
    return f"""\
# {familiar_id}: this familiar's own settings, merged over
# data/familiars/_default/character.toml (which documents every knob).
# Write only what differs from the defaults; check the result with
#   familiar config show --familiar {familiar_id}
# Secrets never go here: they come from the environment (see .env.example).

# Names it answers to; the first is its display name.
aliases = [{json.dumps(alias, ensure_ascii=False)}]

# display_tz = "America/Los_Angeles"

# Models (litellm model strings); "" means not configured.
# [llm.reply]
# model = "openrouter/anthropic/claude-sonnet-4"
# api_key_env = "OPENROUTER_API_KEY"
#
# [llm.background]
# model = "openrouter/z-ai/glm-4.6"
# api_key_env = "OPENROUTER_API_KEY"

# Memory projections (a list replaces the default list whole).
# [providers.memory]
# projectors = ["rolling_summary", "rich_note", "fact_supersede", "people_dossier", "reflection"]
"""


def _existing_files(familiar: paths.FamiliarPaths) -> list[Path]:
    return [p for p in (familiar.character_toml, familiar.character_md, familiar.turns_db) if p.exists()]


def _back_up(path: Path, stamp: str) -> Path:
    backup = path.with_name(f"{path.name}.bak-{stamp}")
    counter = 1
    while backup.exists():
        backup = path.with_name(f"{path.name}.bak-{stamp}-{counter}")
        counter += 1
    path.rename(backup)
    return backup


def require_familiar(familiar_id: str, root: Path | None = None) -> paths.FamiliarPaths:
    """The familiar's paths if it exists (it has a turn log); else one line with near names.

    Every command that takes `--familiar` refuses a familiar that does not exist in the
    same words, naming the existing ones a typo may have meant and how to create it, so
    a typo never quietly becomes a new, empty familiar.
    """
    familiar = paths.FamiliarPaths.for_id(familiar_id, root)
    if familiar.turns_db.exists():
        return familiar
    hint = paths.did_you_mean(familiar_id, paths.list_familiars(familiar.root))
    raise CliError(f"no familiar {familiar_id!r} under {familiar.root}{hint} "
                   f"(to create it: familiar init {familiar_id})")


def create_turn_log(turns_db: Path) -> None:
    """Create (or just open and migrate) the familiar's turn log; never removes turns."""
    from familiar_pipeline.storage.turns import TurnLog, TurnLogError

    try:
        TurnLog(turns_db).close()
    except TurnLogError as exc:
        raise CliError(f"{turns_db}: {exc}") from None


def init_familiar(familiar_id: str, *, root: Path | None = None, alias: str | None = None,
                  force: bool = False) -> list[str]:
    """Create `data/familiars/<id>/`; returns what was done, one line per action.

    Refuses when the familiar already has files, unless `force`: then the two
    character files are moved aside to timestamped backups and rewritten, and an
    existing turn log is kept as it is.
    """
    familiar = paths.FamiliarPaths.for_id(familiar_id, root)
    existing = _existing_files(familiar)
    if existing and not force:
        names = ", ".join(p.name for p in existing)
        raise CliError(
            f"familiar {familiar_id!r} already exists in {familiar.dir} ({names}); "
            "use --force to rewrite its character files (turns are never deleted)"
        )
    alias = (alias if alias is not None else default_alias(familiar_id)).strip()
    if not alias:
        raise CliError("--alias must not be blank", EXIT_CONFIG)

    default_card = paths.default_dir(familiar.root) / "character.md"
    contents = {
        familiar.character_toml: override_toml(familiar_id, alias).encode("utf-8"),
        familiar.character_md: default_card.read_bytes(),
    }
    done: list[str] = []
    private_dir(familiar.root)  # the data root and the familiar's folder: its owner's only
    private_dir(familiar.dir)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for path, content in contents.items():
        if path.exists():
            if path.read_bytes() == content:
                done.append(f"kept {path} (already the fresh version)")
                continue
            done.append(f"moved old {path.name} to {_back_up(path, stamp).name}")
        path.write_bytes(content)
        done.append(f"wrote {path}")

    had_turns = familiar.turns_db.exists()
    create_turn_log(familiar.turns_db)
    done.append(f"{'kept' if had_turns else 'created'} turn log {familiar.turns_db}")
    return done


def _configure_init(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the familiar's id (a-z, 0-9, '_', '-'); names its folder")
    parser.add_argument("--alias", help="display name (default: the id, capitalised)")
    parser.add_argument("--force", action="store_true",
                        help="rewrite the character files of an existing familiar "
                             "(old ones are backed up; turns are kept)")


def _run_init(args: argparse.Namespace) -> int:
    for line in init_familiar(args.name, alias=args.alias, force=args.force):
        print(line)
    # Prove the new files load, with this process's environment overrides applied.
    config = load_config(args.name)
    print(f"familiar {config.familiar_id!r} ({config.display_name}) is ready; edit "
          f"{paths.FamiliarPaths.for_id(args.name).character_md} to give it a persona")
    return 0


# --------------------------------------------------------------------------- config


def _configure_config(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print the effective configuration (secrets masked)",
                              description="Print the effective configuration of one familiar: "
                              "defaults, its character.toml and environment overrides, merged "
                              "and validated. Secrets are shown only as set or unset.")
    show.add_argument("--familiar", metavar="ID",
                      help="familiar id (default: $FAMILIAR_ID, else 'familiar')")


def _run_config(args: argparse.Namespace) -> int:
    # Only `show` exists; argparse rejects anything else before we get here.
    config = load_config(args.familiar)
    own_file = paths.FamiliarPaths.for_id(config.familiar_id).character_toml
    if not own_file.is_file():
        print(f"note: {own_file} does not exist; showing the defaults "
              f"(create it with: familiar init {config.familiar_id})", file=sys.stderr)
    sys.stdout.write(render_config(config))
    return 0


# --------------------------------------------------------------------------- .env


def load_env_file(environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """Read the repository's `.env` (or ``$FAMILIAR_ENV_FILE``) into `environ`; the file read, if any.

    Secrets and per-host settings (`DISCORD_TOKEN`, provider keys, `FAMILIAR_DATA_ROOT`, ...) live
    there rather than in character.toml (.env.example lists them). A variable already set in the
    environment wins over the file, so a one-off `FAMILIAR_ID=x familiar ...` still does what it says.
    Read with python-dotenv (quoting, `export` prefixes, comments) rather than a hand parser; every
    process `familiar` starts (Dagster, runs, the bot) inherits what it read.
    """
    configured = environ.get(ENV_FILE_VAR)
    if configured == "":
        return None
    path = Path(configured).expanduser() if configured else paths.REPO_ROOT / ".env"
    if not path.is_file():
        if configured:
            raise CliError(f"{ENV_FILE_VAR}={configured} names no file", EXIT_CONFIG)
        return None
    from dotenv import dotenv_values

    for name, value in dotenv_values(path).items():
        if value is not None and name not in environ:
            environ[name] = value
    return path


# --------------------------------------------------------------------------- table and main


COMMANDS: list[Command] = [
    Command("init", "create a new familiar's folder, character files and turn log",
            _configure_init, _run_init),
    Command("config", "inspect configuration (familiar config show)", _configure_config, _run_config),
]


def discovered_commands() -> list[Command]:
    """COMMANDS plus every `familiar_bot.app.cli.commands.<module>.COMMAND`, sorted by name after init/config."""
    import importlib
    import pkgutil

    from familiar_bot.app.cli import commands as package

    found = []
    for module in pkgutil.iter_modules(package.__path__):
        command = getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "COMMAND", None)
        if isinstance(command, Command):
            found.append(command)
    return COMMANDS + sorted(found, key=lambda c: c.name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="familiar",
        description="familiar: a Discord companion whose long-term memory is a Dagster asset graph.",
        epilog="Data lives under $FAMILIAR_DATA_ROOT (default: data/familiars in the repo).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in discovered_commands():
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def main(argv: Sequence[str] | None = None) -> int:
    # What this command and every process it starts (Dagster, runs, the bot) writes is
    # its owner's only: turn logs, stores, caches and run history quote private messages.
    use_private_umask()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error argparse already printed
        return exit_.code if isinstance(exit_.code, int) else EXIT_CONFIG
    try:
        load_env_file()
        return args.run(args)
    except (ConfigError, paths.InvalidFamiliarId) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONFIG
    except CliError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return exc.code
    except OSError as exc:  # unwritable data root, full disk: the operator's to fix
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_REFUSED


if __name__ == "__main__":
    # Run through the importable module so command modules share its Command class.
    from familiar_bot.app.cli.main import main as _main

    sys.exit(_main())
