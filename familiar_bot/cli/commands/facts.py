"""`familiar facts`: print a familiar's facts with their validity and lineage (an audit read).

It reads the published Parquet snapshot, never memory.duckdb, so it works while
a pipeline run holds the store. Default: current truth (not retired, not
expired). `--as-of DATE` gives the world-time slice at that instant, retired
rows included, so an earlier belief can be reconstructed; `--include-retired`
adds retired rows to the current view. Each line shows the fact's world-time
validity, its importance and subjects, the turns it came from, and its
lineage: what it replaced and what replaced it.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from familiar_bot.cli.main import EXIT_CONFIG, CliError, Command


def parse_when(text: str) -> datetime:
    """A date (read as 00:00 UTC) or an ISO-8601 timestamp (no offset = UTC), as an aware UTC datetime.

    The same reading the fact extractor gives a model's valid_from/valid_to.
    """
    from familiar_pipeline.projectors.facts import parse_instant  # lazily: it loads the store (DuckDB)

    when = parse_instant(text)
    if when is None:
        raise CliError(f"--as-of {text!r} is not a date (YYYY-MM-DD) or ISO-8601 timestamp", EXIT_CONFIG)
    return when


def select_facts(snapshot, *, subject: str | None, as_of: datetime | None, include_retired: bool, now: datetime | None = None) -> list[dict]:
    """The rows to print, ascending by id."""
    now = now or datetime.now(timezone.utc)
    if as_of is not None:
        rows = snapshot.recent_facts(10**9, as_of=as_of)[::-1]
    elif include_retired:
        rows = [
            r for r in snapshot.table("facts").to_pylist()
            if r["valid_to"] is None or r["valid_to"] > now
        ]
    else:
        rows = snapshot.current_facts(now=now)
    if subject:
        rows = [r for r in rows if any(s["canonical_key"] == subject for s in r["subjects"] or [])]
    return rows


def _day(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d") if value else "…"


def render_fact(row: dict, replaced: list[int]) -> str:
    status = "current" if row["superseded_at"] is None else (
        f"retired {_day(row['superseded_at'])}" + (f" by #{row['superseded_by']}" if row["superseded_by"] else "")
    )
    subjects = ", ".join(f"{s['canonical_key']} ({s['display_at_write']})" for s in row["subjects"] or []) or "no subject"
    importance = f"importance {row['importance']}" if row["importance"] is not None else "importance ?"
    lineage = f"; replaces #{', #'.join(map(str, replaced))}" if replaced else ""
    turns = ", ".join(map(str, row["source_turn_ids"] or [])) or "none"
    return (
        f"#{row['id']} [{status}] {row['text']}\n"
        f"    valid {_day(row['valid_from'])} → {_day(row['valid_to'])}; {importance}; about {subjects}; "
        f"from turns {turns}{lineage}"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--familiar", required=True, metavar="ID", help="familiar id")
    parser.add_argument("--subject", metavar="KEY", help="only facts about this canonical key, e.g. discord:1234 or ego:<id>")
    parser.add_argument("--as-of", metavar="DATE", help="world-time slice at this date or ISO timestamp (retired rows included)")
    parser.add_argument("--include-retired", action="store_true", help="also show facts a newer fact retired")


def run(args: argparse.Namespace) -> int:
    from familiar_pipeline.storage.paths import FamiliarPaths
    from familiar_pipeline.storage.snapshots import SnapshotFormatError, SnapshotReader, read_manifest

    paths = FamiliarPaths.for_id(args.familiar)
    if not paths.dir.is_dir():
        raise CliError(f"no familiar {args.familiar!r} under {paths.root}; create it with `familiar init {args.familiar}`")
    as_of = parse_when(args.as_of) if args.as_of else None
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
    rows = select_facts(snapshot, subject=args.subject, as_of=as_of, include_retired=args.include_retired)
    replaced: dict[int, list[int]] = {}
    for row in snapshot.table("facts").to_pylist():
        if row["superseded_by"] is not None:
            replaced.setdefault(row["superseded_by"], []).append(row["id"])
    view = f"as of {as_of.isoformat()}" if as_of else ("current and retired" if args.include_retired else "current")
    scope = f" about {args.subject}" if args.subject else ""
    print(f"{len(rows)} fact(s){scope}, {view} (snapshot v{snapshot.version})")
    for row in rows:
        print(render_fact(row, sorted(replaced.get(row["id"], []))))
    return 0


COMMAND = Command("facts", "print a familiar's facts with validity and lineage (reads the serving snapshot)", configure, run)
