"""`familiar facts`: print a familiar's facts with their validity and lineage (an audit read).

It reads the published Parquet snapshot, never memory.duckdb, so it works while
a pipeline run holds the store. Default: current truth (not retired, not
expired). `--as-of DATE` gives the world-time slice at that instant, retired
rows included, so an earlier belief can be reconstructed; `--include-retired`
adds retired rows to the current view. Each line shows the fact's world-time
validity, its importance and subjects, the turns it came from, and its
lineage: what it replaced and what replaced it. `--scope SCOPE` keeps only the
facts of one scope (``guild:<id>``, ``channel:<id>`` or ``familiar``: see
`familiar_pipeline.storage.scopes`), as a reply in that scope would read them.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from familiar_bot.app.cli.main import EXIT_CONFIG, CliError, Command, require_familiar
from familiar_pipeline.config import SCOPE_HINT, SCOPE_PATTERN
from familiar_pipeline.projectors.facts.reads import facts_for_subject, recent_facts
from familiar_pipeline.storage.times import parse_instant


def parse_when(text: str) -> datetime:
    """A date (read as 00:00 UTC) or an ISO-8601 timestamp (no offset = UTC), as an aware UTC datetime.

    The same reading the fact extractor gives a model's valid_from/valid_to.
    """
    when = parse_instant(text)
    if when is None:
        raise CliError(f"--as-of {text!r} is not a date (YYYY-MM-DD) or ISO-8601 timestamp", EXIT_CONFIG)
    return when


def parse_scope(text: str) -> str:
    """A scope string as ``[memory.scopes]`` accepts it, else a one-line usage error."""
    if not SCOPE_PATTERN.fullmatch(text):
        raise CliError(f"--scope {text!r} is not a scope: expected {SCOPE_HINT}", EXIT_CONFIG)
    return text


def select_facts(snapshot, *, subject: str | None, as_of: datetime | None, include_retired: bool,
                 now: datetime | None = None, scope: str | None = None) -> list:
    """The facts to print (``Fact`` records), ascending by id, in the snapshot's ``FactView`` of these
    options; with ``scope``, only that scope's."""
    if subject:
        rows = facts_for_subject(snapshot, subject, as_of, include_superseded=include_retired, now=now)
    else:
        rows = recent_facts(snapshot, 10**9, as_of, include_superseded=include_retired, now=now)[::-1]
    return rows if scope is None else [f for f in rows if f.scope == scope]


def _day(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d") if value else "…"


def render_fact(fact, replaced: list[int]) -> str:
    status = "current" if fact.superseded_at is None else (
        f"retired {_day(fact.superseded_at)}" + (f" by #{fact.superseded_by}" if fact.superseded_by else "")
    )
    subjects = ", ".join(f"{s.canonical_key} ({s.display_at_write})" for s in fact.subjects) or "no subject"
    importance = f"importance {fact.importance}" if fact.importance is not None else "importance ?"
    lineage = f"; replaces #{', #'.join(map(str, replaced))}" if replaced else ""
    turns = ", ".join(map(str, fact.source_turn_ids)) or "none"
    return (
        f"#{fact.id} [{status}] {fact.text}\n"
        f"    valid {_day(fact.valid_from)} → {_day(fact.valid_to)}; {importance}; about {subjects}; "
        f"from turns {turns}{lineage}; scope {fact.scope}"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", required=True, metavar="ID", help="familiar id")
    parser.add_argument("--subject", metavar="KEY", help="only facts about this canonical key, e.g. discord:1234 or ego:<id>")
    parser.add_argument("--as-of", metavar="DATE", help="world-time slice at this date or ISO timestamp (retired rows included)")
    parser.add_argument("--include-retired", action="store_true", help="also show facts a newer fact retired")
    parser.add_argument("--scope", metavar="SCOPE",
                        help='only the facts of this scope: "guild:<id>", "channel:<id>" or "familiar"')


def run(args: argparse.Namespace) -> int:
    from familiar_pipeline.storage.snapshots import SnapshotFormatError, SnapshotReader, read_manifest

    paths = require_familiar(args.familiar)
    as_of = parse_when(args.as_of) if args.as_of else None
    only = parse_scope(args.scope) if args.scope is not None else None
    try:
        manifest = read_manifest(paths.serving_dir)
    except SnapshotFormatError as exc:
        raise CliError(str(exc)) from None
    if manifest is None:
        print(f"no facts published yet for {args.familiar} (no snapshot in {paths.serving_dir}); run the pipeline first")
        return 0
    reader = SnapshotReader(paths.serving_dir)
    snapshot = reader.current()
    if reader.last_error:
        raise CliError(f"cannot read the snapshot in {paths.serving_dir}: {reader.last_error}")
    rows = select_facts(snapshot, subject=args.subject, as_of=as_of, include_retired=args.include_retired,
                        scope=only)
    replaced: dict[int, list[int]] = {}
    lineage = snapshot.table("facts").select(["id", "superseded_by"]).to_pylist()
    for row in lineage:
        if row["superseded_by"] is not None:
            replaced.setdefault(row["superseded_by"], []).append(row["id"])
    view = f"as of {as_of.isoformat()}" if as_of else ("current and retired" if args.include_retired else "current")
    about = f" about {args.subject}" if args.subject else ""
    where = f" in scope {only}" if only else ""
    print(f"{len(rows)} fact(s){about}{where}, {view} (snapshot v{snapshot.version})")
    for fact in rows:
        print(render_fact(fact, sorted(replaced.get(fact.id, []))))
    return 0


COMMAND = Command("facts", "print a familiar's facts with validity and lineage (reads the serving snapshot)", configure, run)
