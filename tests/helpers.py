"""Shared builders for pipeline and bot tests (plain functions, not fixtures)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLog

FAKE_MODEL_TOML = """
[llm.background]
model = "fake/careful"
"""

PEOPLE = [("discord:111", "Cass"), ("discord:222", "Bo"), ("discord:333", "Mia")]
LINES = [
    "I just moved to Berlin for a new job at a bakery",
    "My cat Pixel knocked over the plants again this morning",
    "We should plan the hiking trip for the first weekend of June",
    "I'm allergic to peanuts so please no satay at the party",
    "Honestly the new album is better than their last three",
    "lol",
    "Started learning the cello last month and my fingers hurt",
    "My sister is visiting from Lisbon next Tuesday",
    "ok",
    "The bakery opens at six so I'm up at five every day",
]


# The cadence the tests' expectations count in (a batch per 10 turns, a summary per 10, a dossier
# fold per 3 batches): the shipped defaults are coarser (20, 20, 4) to stay under 40 model calls
# per 100 turns, which benchmarks/pipeline.py measures; the mechanisms tested are the same.
TEST_CADENCE = {("rolling_summary", "turns_threshold"): 10, ("rich_note", "batch_size"): 10,
                ("people_dossier", "batches_per_fold"): 3, ("people_dossier", "fold_min_weight"): 0,
                ("reflection", "turns_threshold"): 20}


def pin_test_cadence(root: Path) -> None:
    """``root/_default/character.toml``: the shipped defaults with :data:`TEST_CADENCE` (kept if present)."""
    import re

    from familiar_pipeline.storage.paths import DEFAULT_FAMILIAR_DIRNAME, SHIPPED_DEFAULT_DIR

    target = root / DEFAULT_FAMILIAR_DIRNAME / "character.toml"
    if target.exists():
        return
    text = (SHIPPED_DEFAULT_DIR / "character.toml").read_text()
    for (table, key), value in TEST_CADENCE.items():
        text, n = re.subn(rf"(\[providers\.memory\.{table}\](?:\n(?!\[).*)*?\n{key} = )\d+", rf"\g<1>{value}", text)
        assert n == 1, (table, key)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    for extra in ("character.md",):
        if (SHIPPED_DEFAULT_DIR / extra).exists():
            (target.parent / extra).write_text((SHIPPED_DEFAULT_DIR / extra).read_text())


def make_familiar(root: Path, familiar_id: str = "fam", extra_toml: str = FAKE_MODEL_TOML) -> FamiliarPaths:
    pin_test_cadence(root)
    paths = FamiliarPaths.for_id(familiar_id, root)
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.character_toml.write_text(extra_toml)
    TurnLog(paths.turns_db).close()
    return paths


def append_chat(paths: FamiliarPaths, n: int, *, start: int = 0, channel_id: int = 10, mode: str | None = None) -> list:
    """n user turns cycling through PEOPLE and LINES, one minute apart (deterministic)."""
    base = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    turns = []
    with TurnLog(paths.turns_db) as log:
        for i in range(start, start + n):
            key, name = PEOPLE[i % len(PEOPLE)]
            log.upsert_participant(key, username=name.lower(), global_name=name)
            turns.append(
                log.append_turn(
                    channel_id=channel_id,
                    guild_id=1,
                    role="user",
                    author_key=key,
                    author_display=name,
                    content=f"{LINES[i % len(LINES)]} (#{i})",
                    mode=mode,
                    created_at=base + timedelta(minutes=i),
                )
            )
    return turns


class CountingEmbedder:
    """Wraps an embedder, recording each call; `drop` returns fewer vectors than asked."""

    def __init__(self, inner, drop: int = 0):
        self.inner, self.drop, self.calls = inner, drop, []
        self.name, self.dim = inner.name, inner.dim

    def embed(self, texts):
        self.calls.append(list(texts))
        vectors = self.inner.embed(texts)
        return vectors[: len(vectors) - self.drop] if self.drop else vectors


REPO_DAGSTER_YAML = Path(__file__).resolve().parents[1] / "dagster_home" / "dagster.yaml"


def repo_instance(home: Path, monkeypatch):
    """A Dagster instance configured by the repository's `dagster_home/dagster.yaml`, in `home`.

    The instance `familiar up` and `dagster dev` use (its event log class, its run queue),
    with its state in a temporary folder; use it as a context manager.
    """
    import shutil

    import dagster as dg

    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_DAGSTER_YAML, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return dg.DagsterInstance.get()


class FullDisk:
    """A turn log whose disk is full, for real: SQLite's `max_page_count` held at the file's size.

    Every write that needs a new page then fails inside SQLite with SQLITE_FULL, which rolls
    the transaction back exactly as a full disk does (a write that fits in a page's free
    space still succeeds, as it would on a real disk whose WAL file has room left). Texts of
    several pages (`BIG`) always need new pages. `free()` gives the space back.
    """

    BIG = 3 * 4096

    def __init__(self, turn_log: TurnLog):
        self.conn = turn_log._live()  # the writer's own connection: the limit is per connection

    def __enter__(self) -> "FullDisk":
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = self.conn.execute("PRAGMA page_count").fetchone()[0]
        self.conn.execute(f"PRAGMA max_page_count = {pages}")
        return self

    def free(self) -> None:
        self.conn.execute("PRAGMA max_page_count = 1073741823")

    def __exit__(self, *exc) -> None:
        self.free()


def long_line(n: int, size: int = FullDisk.BIG) -> str:
    """A distinct message of about `size` characters (several pages of the turn log)."""
    words = f"line {n} " + " ".join(f"word{n}x{i}" for i in range(size // 8))
    return words[:size]


def sensor_tick(cursor: dict, familiars: list[str], known, **kwargs):
    """One sensor tick's decisions as run requests: (requests, new partitions, cursor, notes)."""
    from familiar_pipeline.defs.sensors import run_requests
    from familiar_pipeline.engine.schedule import plan_tick

    plan = plan_tick(cursor, familiars, known, **kwargs)
    return run_requests(plan), plan.new_partitions, plan.cursor, plan.notes


def cache_rows(path: Path) -> dict[str, tuple[str, set[int], int | None]]:
    """The LLM response cache file's replies: key -> (text, recorded turns, recorded upto)."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        texts = dict(conn.execute("SELECT key, text FROM llm_response_cache"))
        turns: dict[str, set[int]] = {}
        for key, turn in conn.execute("SELECT key, turn_id FROM llm_cache_turns"):
            turns.setdefault(key, set()).add(turn)
        upto = dict(conn.execute("SELECT key, upto FROM llm_cache_upto"))
    finally:
        conn.close()
    return {key: (text, turns.get(key, set()), upto.get(key)) for key, text in texts.items()}


def file_bytes(path: Path) -> bytes:
    """A SQLite file's bytes and its WAL's: everything of it on disk that could hold a deleted value."""
    return b"".join(p.read_bytes() for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def sensor_driver(instance, root, familiar_id: str = "fam", *, start: float = 0.0, settle: int = 12):
    """`tick()`: one turn-sensor tick over `familiar_id` and its runs in this process, as the daemon
    would do them, a minute after the last; it returns the assets the runs materialized. The
    familiar is first ticked until the sensor asks for nothing (at most `settle` ticks)."""
    from familiar_pipeline.defs.jobs import execute_request

    instance.add_dynamic_partitions("familiars", [familiar_id])
    clock = [start]
    cursor: dict = {}

    def tick() -> list:
        nonlocal cursor
        clock[0] += 60
        requests, _, cursor, _ = sensor_tick(cursor, [familiar_id], [familiar_id], root=root, in_flight={},
                                             max_requests=5, now=clock[0])
        done = []
        for request in requests:
            result = execute_request(request, instance=instance, data_root=root)
            assert result.success
            done += [e.asset_key.path[-1] for e in result.get_asset_materialization_events()]
        return done

    for _ in range(settle):
        if not tick():
            break
    return tick
