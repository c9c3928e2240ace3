"""`familiar up`: the Dagster UI, daemon and the bot as one supervised group, from one command.

Starts the real `dagster dev` (webserver + daemon, so the turn-watermark sensor and
the run queue work) bound to 127.0.0.1, waits until the UI answers, says "ready", then
runs the bot: on Discord (a child process) when DISCORD_TOKEN is set, otherwise the
console chat in the foreground of this terminal. Dagster's own output goes to a log
file, so the console stays readable.

One `familiar up` per DAGSTER_HOME and data root: a second one is refused in one line
naming the first (`--attach` runs only a console chat with it instead), and one that was
killed is taken over (`take_instance`). FAMILIAR_ID is set for the children; the turn
sensor reads every familiar's own `[pipeline]` cadence. `--demo` gives its demo familiar, and only it, the scripted offline model
and small batches (`familiar_pipeline.config.demo`), through the environment of this
process and its children only, and says so once.

Stopping: Ctrl-C, SIGTERM, or the end of console input (Ctrl-D, or a closed pipe)
stops every child within 10 s. When `dagster dev` exits on its own (it exits, with
status 0, when its daemon dies) it is started again with backoff while the chat stays
up, and each step is said; any other child that exits stops the rest with a non-zero
status.

Privacy: the data root, DAGSTER_HOME and its log are its owner's only, and the
children's temporary folder (where Dagster puts its gRPC sockets) is a private one.
The UI has no login: bound to anything but loopback, it warns and says where the
recipe for an authenticating proxy is.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from familiar_bot.app import supervisor
from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command
from familiar_pipeline import webserver
from familiar_pipeline.storage.private import private_dir

EXIT_CHILD_DIED = 1
POLL_S = 0.2
DEMO_NOTICE = ("demo mode: replies, facts, summaries and dossiers of familiar {familiar!r} come from a scripted "
               "offline model (familiar_pipeline/testing/scripted.py), not a language model; nothing leaves this "
               "machine. Settings for this run and this familiar only; no file is changed.")
OPEN_UI_WARNING = ("warning: the Dagster UI has no login, and --host {host} lets anyone who can reach {address} "
                   "read what was said (run metadata quotes messages) and launch runs. Bind it to 127.0.0.1 and "
                   "reach it through an SSH tunnel, or put it behind a proxy that authenticates: "
                   "docs/playbook.md, \"Expose the UI safely\".")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", metavar="ID",
                        help="familiar id (default: $FAMILIAR_ID, else 'familiar'); must exist "
                             "(`familiar init`), except the first one on an empty data root and the "
                             "--demo familiar, which are created from the defaults")
    parser.add_argument("--port", type=int, default=3000, help="Dagster UI port (default 3000)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the Dagster UI binds to (default 127.0.0.1; the UI has no "
                             "login: anything else prints a warning; expose it only behind a proxy "
                             "that authenticates, see docs/playbook.md)")
    parser.add_argument("--instance", metavar="URL",
                        help="keep Dagster's runs, events and schedules in this PostgreSQL database "
                             "(postgresql://user:password@host:port/db; default: $FAMILIAR_INSTANCE_URL, else SQLite "
                             "files in DAGSTER_HOME); its dagster.yaml is written to $DAGSTER_HOME, else dagster_home/postgres")
    parser.add_argument("--no-bot", action="store_true", help="run only Dagster (UI, sensors, runs)")
    parser.add_argument("--no-ui", action="store_true",
                        help="a small host: run the Dagster daemon (sensors, run queue, runs) and the bot without the "
                             "webserver, so no UI; `familiar backfill` and `familiar forget` then run in their own "
                             "process (docs/running.md, \"Small hosts\")")
    parser.add_argument("--attach", action="store_true",
                        help="a `familiar up` already runs on this DAGSTER_HOME and data root: run only a console "
                             "chat with it (its familiar unless --familiar is given); without this flag a second "
                             "`familiar up` is refused, naming the running one")
    parser.add_argument("--as", dest="speaker", metavar="NAME",
                        help="console chat only: who you are (default: the name you gave on first "
                             "start, asked once per familiar)")
    parser.add_argument("--channel", type=int, default=None, metavar="N",
                        help="console chat only: channel number to record turns under (default 1)")
    parser.add_argument("--demo", action="store_true",
                        help="offline demo: replies and memory come from a scripted model (no LLM, no "
                             "network), with small batches so facts show within a minute, for the demo "
                             "familiar only ('familiar' unless --familiar is given); other familiars are untouched")


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
    """Serve this DAGSTER_HOME and data root, unless a live `familiar up` already does (then refuse, or --attach)."""
    from familiar_pipeline.storage.paths import data_root

    if not 0 < args.port < 65536:
        raise CliError(f"--port must be 1-65535, got {args.port}", EXIT_CONFIG)
    home, root = supervisor.dagster_home(), data_root()
    if args.attach:
        holder = webserver.running_instance(home, root)
        if holder is None:
            raise CliError(f"--attach: no familiar up runs on DAGSTER_HOME {home} or data root {root}; "
                           "start one with `familiar up` (without --attach)")
        return attach(args, holder)
    instance_url = reachable_instance(args.instance)  # an unreachable instance is refused before anything is created
    lock = take_instance(home, root, args)
    try:
        return serve(args, lock, instance_url)
    finally:
        lock.release()


def take_instance(home: Path, root: Path, args: argparse.Namespace) -> webserver.InstanceLock:
    """This process's hold on the DAGSTER_HOME and the data root; one line naming the live holder if taken.

    A holder that is gone (killed: its `flock` went with it) is taken over, and whatever
    of its `dagster dev` still runs on this DAGSTER_HOME is stopped first, so two daemons
    never share one instance.
    """
    address = "no UI" if getattr(args, "no_ui", False) else supervisor.local_address(args.host, args.port)
    info = {"address": address, "dagster_home": str(home),
            "data_root": str(root), "familiar": args.familiar or os.environ.get("FAMILIAR_ID") or None}
    private_dir(home)
    private_dir(root)
    try:
        lock = webserver.InstanceLock.acquire(home, root, info)
    except webserver.InstanceRunning as exc:
        raise CliError(f"{exc} is already running; chat with it: `familiar up --attach`, or stop it first") from None
    before = lock.previous
    if before.get("pid") and before["pid"] != os.getpid():
        left = supervisor.leftovers(before.get("children") or [], before.get("children_home") or home)
        if left:
            supervisor.stop_pids(left)
        say(f"took over from familiar up pid {before['pid']}, which is gone"
            + (f"; stopped {len(left)} process(es) it left running on this DAGSTER_HOME" if left else ""))
        # Its marker names a dead launcher: this one is the owner now (a Postgres instance's home holds it).
        webserver.remove_marker(before.get("children_home") or home, pid=int(before["pid"]))
    return lock


def attach(args: argparse.Namespace, holder: dict) -> int:
    """Only a console chat, with the familiar the running `familiar up` serves (or --familiar).

    The running instance's sensor projects what is said here, as it would its own chat. A
    demo instance's familiar gets the demo's scripted reply model here too.
    """
    from familiar_bot.app.cli.commands import chat

    running = webserver.describe_holder(holder, supervisor.dagster_home() / webserver.LOCK_NAME)
    args.familiar = args.familiar or holder.get("familiar")
    demo = holder.get("demo")
    if args.demo and not demo:
        raise CliError(f"--demo --attach: the running {running} is not a demo; attach without --demo, or stop it "
                       "and start `familiar up --demo`")
    if demo and (args.familiar or demo) == demo:
        args.familiar = demo
        enter_demo(args)
    say(f"attached to {running}: a chat only; its daemon projects what is said here")
    return chat.run(argparse.Namespace(familiar=args.familiar, speaker=args.speaker, channel=args.channel))


def serve(args: argparse.Namespace, lock: webserver.InstanceLock, instance_url: str | None = None) -> int:
    """Start the group and watch it until it stops; `lock` holds the DAGSTER_HOME and data root meanwhile.

    `instance_url`: a reachable PostgreSQL instance (`--instance`), else None for SQLite in DAGSTER_HOME.
    """
    from familiar_bot.app.cli.commands.chat import (check_channel, check_speaker, ensure_familiar, familiar_id_from,
                                                refuse_scripted_models)
    from familiar_pipeline.config import load_config

    if args.demo:
        enter_demo(args)
        lock.update(demo=args.familiar)
    familiar_id = familiar_id_from(args)
    lock.update(familiar=familiar_id)
    channel = check_channel(args.channel)
    check_speaker(args.speaker)
    if args.no_ui and args.demo:
        raise CliError("--no-ui and --demo: the demo is there to be watched in the UI; drop one of them", EXIT_CONFIG)
    if not args.no_ui and supervisor.port_in_use(supervisor.local_host(args.host), args.port):
        raise CliError(f"port {args.port} is already in use (another `familiar up` or `dagster dev`?); "
                       "stop it or pick another with --port")
    instance_env = postgres_instance(instance_url)
    if ensure_familiar(familiar_id, create=args.demo):
        say(f"created familiar {familiar_id!r} from the defaults")
    config = load_config(familiar_id)  # fail on bad config before starting anything
    refuse_scripted_models(config, familiar_id)
    transport = "none" if args.no_bot else ("discord" if config.secrets.discord_token else "console")

    extra = {"FAMILIAR_ID": familiar_id, **instance_env}
    private_tmp = Path(tempfile.mkdtemp(prefix="familiar-up-"))  # 0700: the children's sockets live here
    # The code location reads every familiar's own [pipeline] (sensor cadence); FAMILIAR_ID names the served one.
    env = supervisor.child_env(extra, private_tmp=private_tmp)
    lock.update(children_home=env["DAGSTER_HOME"])  # a Postgres instance's, under this one (--instance)
    private_dir(env["FAMILIAR_DATA_ROOT"])
    log_path = Path(env["DAGSTER_HOME"]) / "familiar-up.log"
    local = supervisor.local_address(args.host, args.port)  # where this machine reaches the UI
    stop = StopRequest()
    previous = {sig: signal.signal(sig, lambda signum, _frame: stop.request(
        f"received {signal.Signals(signum).name}", 128 + signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    children: list[supervisor.Child] = []
    console: threading.Thread | None = None
    from familiar_bot.transports.console import TerminalState

    terminal = TerminalState.save()
    try:
        daemon_ready: list = [None]  # --no-ui: the probe of the daemon started last

        workspace = None
        if args.no_ui:  # the code location served as `dagster dev` serves it; the daemon connects to it
            say("starting the code server...")
            try:
                code_server, workspace = supervisor.start_code_server(env=env, log_path=log_path, folder=private_tmp)
            except supervisor.ChildExited as exc:
                say(f"not ready: {exc}")
                return EXIT_CHILD_DIED
            children.append(code_server)
            lock.update(children=[*lock.info.get("children", []), code_server.pgid][-8:])

        def start_dagster() -> supervisor.Child:
            if args.no_ui:
                assert workspace is not None
                child, daemon_ready[0] = supervisor.start_dagster_daemon(env=env, log_path=log_path,
                                                                         workspace=workspace)
            else:
                child = supervisor.start_dagster_dev(args.host, args.port, env=env, log_path=log_path)
            # Named in the lock, so the next `familiar up` can stop it if this one is killed.
            lock.update(children=[*lock.info.get("children", []), child.pgid][-8:])
            return child

        children.append(start_dagster())
        ready = (lambda: daemon_ready[0]()) if args.no_ui else f"{local}/server_info"
        if args.no_ui:
            address = "no UI (--no-ui)"
            say(f"Dagster daemon without the UI (DAGSTER_HOME={env['DAGSTER_HOME']}; Dagster's log: {log_path})")
            say("starting the daemon...")
        else:
            address = supervisor.ui_address(args.host, args.port)
            say(f"Dagster UI: {address} (DAGSTER_HOME={env['DAGSTER_HOME']}; Dagster's log: {log_path})")
            if not supervisor.is_loopback(args.host):
                say(OPEN_UI_WARNING.format(host=args.host or "''", address=address))
            say("starting the webserver and daemon...")
        try:
            waited = supervisor.wait_until_ready(ready, children, should_stop=lambda: stop.requested)
        except supervisor.ChildExited as exc:
            say(f"not ready: {exc}")
            return EXIT_CHILD_DIED
        except InterruptedError:
            return stop.status
        say(f"ready in {waited:.1f}s: {address} (familiar {familiar_id!r}, bot: {transport})")
        if not args.no_ui:  # lets `familiar backfill` tell this webserver from one of another checkout or data root
            webserver.write_marker(env["DAGSTER_HOME"], local, data_root_dir=env["FAMILIAR_DATA_ROOT"])

        if transport == "discord":
            argv = [sys.executable, "-m", "familiar_bot.app.cli.main", "bot", "--familiar", familiar_id]
            children.append(supervisor.start_child("discord bot", argv, env=env))
            lock.update(children=[*lock.info.get("children", []), children[-1].pgid][-8:])
        elif transport == "console":
            console = start_console(familiar_id, config, args.speaker, channel, stop)
        watch(children, stop, supervisor.Restarter("dagster daemon" if args.no_ui else "dagster dev", start_dagster,
                                                   ready, say=say))
        say(f"stopping ({stop.reason})")
        return stop.status
    finally:
        webserver.remove_marker(env["DAGSTER_HOME"])
        took = supervisor.stop_children(children)
        if children:
            say(f"stopped every child in {took:.1f}s")
        shutil.rmtree(private_tmp, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if console is not None and console.is_alive():
            # The console thread is blocked reading the terminal and cannot be woken;
            # everything it owned is closed, so leave without waiting for it, and give the
            # terminal back as it was (line editing had it in raw mode).
            terminal.restore()
            sys.stdout.flush()
            sys.stderr.flush()
            lock.release()  # its children are stopped: the next `familiar up` may start
            os._exit(stop.status)


def reachable_instance(url_arg: str | None) -> str | None:
    """--instance (or $FAMILIAR_INSTANCE_URL) once its database answers (one line if not); None: SQLite.

    Asked before the lock is taken, so a mistyped URL is refused touching nothing.
    """
    from familiar_pipeline.instance import InstanceError, check_reachable, instance_url_from

    url = instance_url_from(url_arg)
    if url is None:
        return None
    try:
        return check_reachable(url)
    except InstanceError as exc:
        raise CliError(str(exc)) from None


def postgres_instance(url: str | None) -> dict[str, str]:
    """With a reachable Postgres URL: the children's environment for that instance; else {}.

    Writes the instance's dagster.yaml (`familiar_pipeline.instance`: Postgres storage, the
    preloaded launcher), once this `familiar up` holds the DAGSTER_HOME.
    """
    from familiar_pipeline.instance import INSTANCE_URL_ENV, POSTGRES_ENV, InstanceError, postgres_home, write_instance

    if url is None:
        return {}
    try:
        home = postgres_home(os.environ.get("DAGSTER_HOME"))
        private_dir(home)
        write_instance(home, shards=False)
    except InstanceError as exc:
        raise CliError(str(exc)) from None
    say(f"Dagster instance: PostgreSQL ({home / 'dagster.yaml'})")
    return {INSTANCE_URL_ENV: url, "DAGSTER_HOME": str(home), **POSTGRES_ENV}


def enter_demo(args: argparse.Namespace) -> None:
    """Give the demo familiar, and only it, the scripted model and small batches; say so once.

    Only the environment of this process changes (the children inherit it): the scripted
    model's script is named for every process (`FAMILIAR_FAKE_LLM`), but the settings that
    select it (`familiar_pipeline.config.demo`) apply to the familiar named by
    `FAMILIAR_DEMO` alone. No character.toml names a scripted model, so nothing outlives the run.
    """
    from familiar_pipeline.config.demo import DEMO_FAMILIAR, DEMO_FAMILIAR_ENV
    from familiar_pipeline.testing.fake_llm import FAKE_LLM_ENV
    from familiar_pipeline.testing.scripted import DEMO_RESPONDER

    if not args.familiar:
        args.familiar = DEMO_FAMILIAR
    os.environ.update({FAKE_LLM_ENV: DEMO_RESPONDER, DEMO_FAMILIAR_ENV: args.familiar})
    say(DEMO_NOTICE.format(familiar=args.familiar))


def watch(children: list[supervisor.Child], stop: StopRequest, restarter: supervisor.Restarter | None = None) -> None:
    """Return when a stop is requested or a child exits on its own.

    The child the `restarter` is for (`dagster dev`) is started again, with backoff, while
    the others (the console chat, a Discord bot) go on; any other child's exit stops the
    group with a non-zero status.
    """
    while not stop.event.wait(POLL_S):
        for i, child in enumerate(children):
            if child.running():
                continue
            say(child.describe_exit())
            if restarter is not None and child.name == restarter.name:
                replacement = restarter.again(child, stop.event)
                if replacement is None:  # a stop came while waiting
                    return
                children[i] = replacement
                continue
            stop.request(f"{child.name} exited", EXIT_CHILD_DIED)
            return


def start_console(familiar_id: str, config, speaker_name: str | None, channel: int,
                  stop: StopRequest) -> threading.Thread:
    """The console chat in a thread, so the main thread stays free to watch children and signals."""
    from familiar_bot.app.cli.commands.chat import _login_name
    from familiar_bot.transports.console import resolve_speaker, run_console
    from familiar_bot.responder.opening import open_responder
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
