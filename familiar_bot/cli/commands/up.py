"""`familiar up`: the Dagster UI, daemon and the bot as one supervised group, from one command.

Starts the real `dagster dev` (webserver + daemon, so the turn-watermark sensor and
the run queue work) bound to 127.0.0.1, waits until the UI answers, says "ready", then
runs the bot: on Discord (a child process) when DISCORD_TOKEN is set, otherwise the
console chat in the foreground of this terminal. Dagster's own output goes to a log
file, so the console stays readable.

The code location reads the served familiar's `[pipeline]` (FAMILIAR_ID is set for the
children). `--demo` points this process and its children, through their environment
only, at the scripted offline model, and says so once.

Stopping: Ctrl-C, SIGTERM, or the end of console input (Ctrl-D, or a closed pipe)
stops every child within 10 s. A child that exits on its own is reported and the
rest are stopped with a non-zero status: nothing restarts silently.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from familiar_bot import supervisor
from familiar_bot.cli.main import EXIT_CONFIG, CliError, Command
from familiar_pipeline import webserver

EXIT_CHILD_DIED = 1
POLL_S = 0.2
DEMO_FAMILIAR = "offline-demo"
DEMO_NOTICE = ("demo mode: replies, facts, summaries and dossiers come from a scripted offline model "
               "(familiar_pipeline/testing/scripted.py), not a language model; nothing leaves this machine. "
               "Settings for this run only; no file is changed.")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", metavar="ID",
                        help="familiar id (default: $FAMILIAR_ID, else 'familiar'); created from the "
                             "defaults if it does not exist yet")
    parser.add_argument("--port", type=int, default=3000, help="Dagster UI port (default 3000)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the Dagster UI binds to (default 127.0.0.1; the UI has no "
                             "login, so expose it only behind something that has one)")
    parser.add_argument("--no-bot", action="store_true", help="run only Dagster (UI, sensors, runs)")
    parser.add_argument("--as", dest="speaker", metavar="NAME",
                        help="console chat only: who you are (default: the name you gave on first "
                             "start, asked once per familiar)")
    parser.add_argument("--channel", type=int, default=None, metavar="N",
                        help="console chat only: channel number to record turns under (default 1)")
    parser.add_argument("--demo", action="store_true",
                        help="offline demo: replies and memory come from a scripted model (no LLM, no "
                             f"network), with small batches so facts show within a minute; familiar "
                             f"'{DEMO_FAMILIAR}' unless --familiar is given")


@dataclass
class StopRequest:
    """Why the group is stopping; the first reason wins."""

    reason: str | None = None
    status: int = 0
    event: threading.Event = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.event = threading.Event()

    def request(self, reason: str, status: int) -> None:
        if self.reason is None:
            self.reason, self.status = reason, status
        self.event.set()

    @property
    def requested(self) -> bool:
        return self.event.is_set()


def say(message: str) -> None:
    """Supervisor messages go to stderr, so a console chat's stdout holds only the chat."""
    print(f"[familiar up] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from familiar_bot.cli.commands.chat import (check_channel, check_speaker, ensure_familiar, familiar_id_from,
                                                refuse_scripted_models)
    from familiar_pipeline.config import load_config

    if not 0 < args.port < 65536:
        raise CliError(f"--port must be 1-65535, got {args.port}", EXIT_CONFIG)
    if args.demo:
        enter_demo(args)
    familiar_id = familiar_id_from(args)
    channel = check_channel(args.channel)
    check_speaker(args.speaker)
    if supervisor.port_in_use(args.host if args.host not in ("0.0.0.0", "") else "127.0.0.1", args.port):
        raise CliError(f"port {args.port} is already in use (another `familiar up` or `dagster dev`?); "
                       "stop it or pick another with --port")
    if ensure_familiar(familiar_id):
        say(f"created familiar {familiar_id!r} from the defaults")
    config = load_config(familiar_id)  # fail on bad config before starting anything
    refuse_scripted_models(config, familiar_id)
    transport = "none" if args.no_bot else ("discord" if config.secrets.discord_token else "console")

    # The code location reads the served familiar's [pipeline] (sensor cadence, flood guard).
    env = supervisor.child_env({"FAMILIAR_ID": familiar_id})
    log_path = Path(env["DAGSTER_HOME"]) / "familiar-up.log"
    stop = StopRequest()
    previous = {sig: signal.signal(sig, lambda signum, _frame: stop.request(
        f"received {signal.Signals(signum).name}", 128 + signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    children: list[supervisor.Child] = []
    console: threading.Thread | None = None
    try:
        children.append(supervisor.start_dagster_dev(args.host, args.port, env=env, log_path=log_path))
        address = supervisor.ui_address(args.host, args.port)
        say(f"Dagster UI: {address} (DAGSTER_HOME={env['DAGSTER_HOME']}; Dagster's log: {log_path})")
        say("starting the webserver and daemon...")
        try:
            waited = supervisor.wait_until_ready(f"{address}/server_info", children,
                                                 should_stop=lambda: stop.requested)
        except supervisor.ChildExited as exc:
            say(f"not ready: {exc}")
            return EXIT_CHILD_DIED
        except InterruptedError:
            return stop.status
        say(f"ready in {waited:.1f}s: {address} (familiar {familiar_id!r}, bot: {transport})")
        # Lets `familiar backfill` tell this webserver from one of another checkout or data root.
        webserver.write_marker(env["DAGSTER_HOME"], address, data_root_dir=env["FAMILIAR_DATA_ROOT"])

        if transport == "discord":
            argv = [sys.executable, "-m", "familiar_bot.cli.main", "bot", "--familiar", familiar_id]
            children.append(supervisor.start_child("discord bot", argv, env=env))
        elif transport == "console":
            console = start_console(familiar_id, config, args.speaker, channel, stop)
        watch(children, stop)
        say(f"stopping ({stop.reason})")
        return stop.status
    finally:
        webserver.remove_marker(env["DAGSTER_HOME"])
        took = supervisor.stop_children(children)
        if children:
            say(f"stopped every child in {took:.1f}s")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if console is not None and console.is_alive():
            # The console thread is blocked reading the terminal and cannot be woken;
            # everything it owned is closed, so leave without waiting for it.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(stop.status)


def enter_demo(args: argparse.Namespace) -> None:
    """Point this process and its children at the scripted model; say so once.

    Only the environment of this process changes (the children inherit it): no
    character.toml names a scripted model, so nothing outlives the run.
    """
    from familiar_pipeline.testing.scripted import DEMO_ENV

    if not args.familiar:
        args.familiar = DEMO_FAMILIAR
    os.environ.update(DEMO_ENV)
    say(DEMO_NOTICE)


def watch(children: list[supervisor.Child], stop: StopRequest) -> None:
    """Return when a stop is requested or a child exits on its own (reported, non-zero status)."""
    while not stop.event.wait(POLL_S):
        for child in children:
            if not child.running():
                say(child.describe_exit())
                stop.request(f"{child.name} exited; nothing is restarted", EXIT_CHILD_DIED)
                return


def start_console(familiar_id: str, config, speaker_name: str | None, channel: int,
                  stop: StopRequest) -> threading.Thread:
    """The console chat in a thread, so the main thread stays free to watch children and signals."""
    from familiar_bot.cli.commands.chat import _login_name
    from familiar_bot.transports.console import resolve_speaker, run_console
    from familiar_bot.responder import open_responder
    from familiar_pipeline.storage.paths import FamiliarPaths

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
    paths = FamiliarPaths.for_id(familiar_id)
    handle = open_responder(paths, config)

    def chat() -> None:
        try:
            speaker = resolve_speaker(paths.dir, speaker_name, fallback=_login_name())
            if speaker is not None:
                asyncio.run(run_console(handle.responder, speaker=speaker, channel_id=channel))
            stop.request("end of console input", 0)
        except BaseException as exc:  # a bug in the chat must still stop the group, visibly
            say(f"console chat failed: {exc!r}")
            stop.request("console chat failed", EXIT_CHILD_DIED)
        finally:
            handle.close()

    thread = threading.Thread(target=chat, name="console-chat", daemon=True)
    thread.start()
    return thread


COMMAND = Command("up", "run everything: the Dagster UI and daemon plus the bot (Discord with "
                  "DISCORD_TOKEN, else a console chat here); Ctrl-C stops it all", configure, run)
