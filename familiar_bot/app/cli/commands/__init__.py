"""One module per `familiar` subcommand beyond init/config.

Each module defines `COMMAND = Command(...)` (see familiar_bot.app.cli.main); `build_parser`
discovers them, so adding a command never touches cli.py.
"""
