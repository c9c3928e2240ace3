"""The `word_tallies` table: per batch of turns and speaker, how many words they said, and its reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from familiar_pipeline.storage.snapshots import where
from familiar_pipeline.storage.store import ProjectionStore
from familiar_pipeline.storage.tables import Index, Provenance, Table, col


@dataclass(frozen=True)
class WordTally:
    batch_end: int = col("BIGINT")  # the last turn id of the batch
    speaker_key: str = col("VARCHAR")
    words: int = col("INTEGER")
    source_turn_ids: tuple[int, ...] = col("BIGINT[]")  # the speaker's turns in the batch
    scope: str = col("VARCHAR")


WORD_TALLIES = Table(
    "word_tallies",
    WordTally,
    key=("batch_end", "speaker_key"),
    provenance=Provenance(turns=("source_turn_ids",)),
    indexes=(Index("word_tallies_speaker", "speaker_key"),),  # a reader asks for one speaker's tallies
    description="Words said per speaker per batch of turns (an example plugin projector).",
)


def write_tallies(store: ProjectionStore, rows: list[WordTally]) -> None:
    if rows:
        store.sql("INSERT INTO word_tallies SELECT unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::INTEGER[]), "
                  "unnest(?::BIGINT[][]), unnest(?::VARCHAR[])",
                  [[r.batch_end for r in rows], [r.speaker_key for r in rows], [r.words for r in rows],
                   [list(r.source_turn_ids) for r in rows], [r.scope for r in rows]])


def tallies(source: Any, speaker_key: str | None = None) -> list[WordTally]:
    """The tallies in a serving snapshot (or a reader's current one), by batch; one speaker's when named."""
    snap = source.current()
    table = snap.table(WORD_TALLIES.name)
    if speaker_key is not None:
        table = where(table, pc.equal(table["speaker_key"], pa.scalar(speaker_key, pa.string())))
    return snap.records(WORD_TALLIES, table)
