"""Fact extraction (projector `rich_note`): atomic, attributed facts from batches of turns.

A batch is a run of consecutive turns by id that ends at `batch_size` turns, or
early at a quiet gap: before a turn that came `quiet_s` or more after the one
before it, or, for the newest turns, once the log has been quiet that long (see
`close_batch`). Where a batch ends is computed from the turns' own timestamps, so
an incremental build and a rebuild from scratch send the same prompts, hit the
same cached replies and write the same rows, and a familiar that goes quiet still
gets its last messages extracted. The watermark always advances past a processed
batch, even when the model's reply was garbage, so one bad batch never stalls the
projection.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

from familiar_pipeline.models.jsonparse import as_int
from familiar_pipeline.models.llm import llm_sources
from familiar_pipeline.projectors.prompting import MAX_FACT_CHARS
from familiar_pipeline.storage.identity import ego_key
from familiar_pipeline.storage.scopes import scope_of_turns, turn_scope
from familiar_pipeline.storage.times import parse_instant
from familiar_pipeline.storage.turns import Turn, TurnLog

from . import prompt
from .batches import next_batch
from .changes import Followed, about_forgotten, forget_changed, pending_changes
from .prompt import ManifestEntry, RawFact
from .spec import PROJECTOR
from .store import FactDraft, append_facts, fact_texts
from .tables import Subject

if TYPE_CHECKING:
    from familiar_pipeline.engine.report import ProjectionReport
    from familiar_pipeline.engine.runtime import FamiliarRuntime

ACTIVITY_RETURN = "activity_return"
SLEEP_RETURN = "sleep_return"
# Finished batches are written together once this many are ready or this much time has
# passed: the store file is opened only for short writes, never across a model call's
# wait, yet a fast catch-up does not pay an open/close per batch.
WRITE_GROUP_BATCHES = 20
WRITE_GROUP_SECONDS = 2.0
# How far back a channel is scanned when widening the participants list.
WIDENING_SCAN_TURNS = 300


_INABILITY = r"(?:cannot|can't|can\s+not|am\s+not\s+able|am\s+unable|is\s+unable|is\s+not\s+able|" \
    r"do\s+not\s+have|don't\s+have|does\s+not\s+have|doesn't\s+have|has\s+no|have\s+no|lacks?)\b"
_SELF_CAPABILITY = re.compile(
    r"^\s*(?:"
    r"as\s+(?:an?\s+)?(?:ai|assistant|language\s+model|llm)\b"
    r"|i\s+" + _INABILITY +
    r"|i'm\s+(?:not\s+able|unable)\b"
    r"|i\s+do(?:n't|\s+not)\s+(?:have|remember|know\s+how)\b"
    r"|the\s+(?:assistant|ai|model|bot|familiar)\s+" + _INABILITY +
    r")",
    re.IGNORECASE,
)


def is_self_capability(text: str, self_name: str) -> bool:
    """True for statements about what the familiar can or cannot do: not memories, system-prompt material.

    Deliberately narrow: "Sapphire cancelled the trip" or "Sapphire can sing" stay facts.
    """
    if _SELF_CAPABILITY.match(text):
        return True
    name = re.escape(self_name.strip())
    return bool(name) and re.match(rf"^\s*{name}\s+{_INABILITY}", text, re.IGNORECASE) is not None


def build_manifest(
    batch: Sequence[Turn], turn_log: TurnLog, *, participants_max: int, self_key: str, self_name: str
) -> list[ManifestEntry]:
    """Who the model may tag: the batch's authors, widened per channel up to participants_max, then the familiar.

    The extractor passes one scope's turns (`scope_groups`); widening keeps to that scope.

    Labels come from each author's display snapshot on their latest turn up to the
    batch's end, never from the live participants table, so a rebuild shows the
    model exactly what the incremental run showed.
    """
    entries: dict[str, str] = {}
    read_from: dict[str, int] = {}  # the turn each label comes from: the reply rests on it
    for turn in batch:
        if turn.author_key and turn.role == "user":
            entries[turn.author_key] = turn.author_display or turn.author_key
            read_from[turn.author_key] = turn.id
    end_id = batch[-1].id
    scopes = {turn_scope(t) for t in batch}  # never widened past the batch's own scope
    channels = list(dict.fromkeys(t.channel_id for t in batch))
    for channel in channels:
        if len(entries) >= participants_max:
            break
        for turn in reversed(turn_log.recent(channel, WIDENING_SCAN_TURNS, before_id=end_id + 1)):
            if len(entries) >= participants_max:
                break
            if (turn.author_key and turn.role == "user" and turn.author_key not in entries
                    and turn_scope(turn) in scopes):
                entries[turn.author_key] = turn.author_display or turn.author_key
                read_from[turn.author_key] = turn.id
    manifest = [ManifestEntry(k, v, read_from[k]) for k, v in disambiguate_labels(entries, self_name).items()]
    manifest.append(ManifestEntry(self_key, self_name))
    return manifest


def scope_groups(batch: Sequence[Turn]) -> list[list[Turn]]:
    """A batch split by scope (`scopes.turn_scope`), each group in id order, groups in order of their first turn.

    Batches end where they always did (`batches.close_batch`); each group is then one
    model call with its own manifest, so no prompt ever holds turns, or participants,
    of two scopes. A single-scope batch is one group: the batch itself.
    """
    groups: dict[str, list[Turn]] = {}
    for turn in batch:
        groups.setdefault(turn_scope(turn), []).append(turn)
    return list(groups.values())


def disambiguate_labels(labels: dict[str, str], self_name: str) -> dict[str, str]:
    """key -> label, with every label shared by two accounts (or with the familiar) made unique.

    Display names are chosen by users: an account renamed "Cor" (or after the
    familiar) must not read as the real Cor to the model, or its claims would be
    tagged with Cor's key. A shared label gets the account's key appended.
    """
    seen: dict[str, int] = {self_name.casefold(): 1}
    for label in labels.values():
        seen[label.casefold()] = seen.get(label.casefold(), 0) + 1
    return {key: (f"{label} ({key})" if seen[label.casefold()] > 1 else label) for key, label in labels.items()}


@dataclass
class BatchOutcome:
    """Validated drafts of one batch and what was dropped on the way."""

    drafts: list[FactDraft] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def validate_facts(
    raw_facts: Sequence[RawFact],
    batch: Sequence[Turn],
    manifest: Sequence[ManifestEntry],
    *,
    self_key: str,
    self_name: str,
) -> BatchOutcome:
    """Turn the model's items into drafts, enforcing in code what the prompt asks.

    Source ids must belong to the batch (activity-return turns excluded), else the
    fact cites the whole batch minus dream turns, ascending. Subject keys must be in
    the manifest, and their display names come from it, never from the model.
    Facts from dream turns are tagged with the familiar only and framed as dreams.
    A wish rests on its one subject's own turns (`wish_source_ids`), else it is kept as a plain fact.
    """
    outcome = BatchOutcome()
    by_id = {t.id: t for t in batch if t.mode != ACTIVITY_RETURN}
    dream_ids = {t.id for t in by_id.values() if t.mode == SLEEP_RETURN}
    fallback = sorted(i for i in by_id if i not in dream_ids) or sorted(by_id)
    labels = {entry.canonical_key: entry.label for entry in manifest}
    for raw in raw_facts:
        text = raw.text.strip()
        if not text:
            outcome.drop("empty_text")
            continue
        if len(text) > MAX_FACT_CHARS:
            outcome.drop("oversized_text")
            continue
        if is_self_capability(text, self_name):
            outcome.drop("self_capability")
            continue
        source_ids = [i for i in dict.fromkeys(raw.source_turn_ids) if i in by_id]
        if len(source_ids) < len(raw.source_turn_ids):
            outcome.drop("unknown_source_ids")  # counted per fact; the fact itself is kept
        if not source_ids:
            source_ids = list(fallback)
        if not source_ids:
            outcome.drop("no_source_turns")
            continue
        keys = list(dict.fromkeys(raw.subject_keys))
        subjects = [Subject(k, labels[k]) for k in keys if k in labels]
        if len(subjects) < len(keys):
            outcome.drop("unknown_subject_keys")
        if any(i in dream_ids for i in source_ids):
            subjects = [Subject(self_key, self_name)]
            if "dream" not in text.lower():
                text = f"{self_name} dreamed that {text}"
        first = by_id[source_ids[0]]
        valid_from = parse_instant(raw.valid_from) or first.created_at
        scope = scope_of_turns(by_id[i] for i in source_ids)
        valid_to = parse_instant(raw.valid_to)
        if valid_to is not None and valid_to <= valid_from:
            outcome.drop("valid_to_not_after_valid_from")  # counted per fact; the fact is kept, open-ended
            valid_to = None
        kind = raw.kind
        if kind == "wish":
            own = wish_source_ids(source_ids, subjects, by_id, dream_ids)
            if own:
                source_ids, first = own, by_id[own[0]]
                scope = scope_of_turns(by_id[i] for i in own)
            else:
                outcome.drop("wish_not_own_words")  # counted per fact; the fact is kept, as a plain one
                kind = "fact"
        outcome.drafts.append(
            FactDraft(
                text=text,
                source_turn_ids=tuple(source_ids),
                subjects=tuple(subjects),
                channel_id=first.channel_id,
                importance=as_int(raw.importance),
                valid_from=valid_from,
                valid_to=valid_to,
                scope=scope,
                kind=kind,
            )
        )
    return outcome


def wish_source_ids(source_ids: Sequence[int], subjects: Sequence[Subject], by_id: dict[int, Turn],
                    dream_ids: set[int]) -> list[int]:
    """The source turns a wish may rest on: its one subject's own turns (not dreams); empty when there are none.

    A wish is what a person asked the familiar themselves: a "wish" about two people, about
    someone who did not say it ("Ana says Bo always wants ..."), or from narration is not one.
    """
    if len(subjects) != 1:
        return []
    key = subjects[0].canonical_key
    return [i for i in source_ids
            if i not in dream_ids and by_id[i].role == "user" and by_id[i].author_key == key]


def extraction_messages(batch: Sequence[Turn], manifest: Sequence[ManifestEntry], *, self_key: str, self_name: str) -> list[dict]:
    prompt_turns = [t for t in batch if t.mode != ACTIVITY_RETURN and not t.deleted]
    # turns by an account whose label had to be made unique speak under that label
    relabelled = {e.canonical_key: e.label for e in manifest if e.label.endswith(f" ({e.canonical_key})")}
    prompt_turns = [replace(t, author_display=relabelled[t.author_key])
                    if t.role == "user" and t.author_key in relabelled else t for t in prompt_turns]
    dream_ids = [t.id for t in prompt_turns if t.mode == SLEEP_RETURN]
    return prompt.build_messages(prompt_turns, manifest, self_name=self_name, self_key=self_key, dream_ids=dream_ids)


def write_outcomes(rt: FamiliarRuntime, report: ProjectionReport, pending: list[tuple[int, BatchOutcome]]) -> None:
    """Write finished batches: one transaction per batch (its facts and its watermark), one snapshot, one index commit."""
    if not pending:
        return
    inserted = []
    with rt.store() as store:
        for batch_end, outcome in pending:
            with store.transaction():
                for fact, is_new in append_facts(store, outcome.drafts):
                    if is_new:
                        inserted.append(fact)
                    else:
                        report.rows_suppressed += 1
                store.set_watermark(PROJECTOR, turn_id=batch_end)
        rt.publish(store)
    report.rows_written += len(inserted)
    if inserted:
        index = rt.fts_facts()
        index.upsert_many((f.id, f.text) for f in inserted)
        if not index.commit():
            report.drop("fts_commit_skipped")
    report.preview.extend(  # ids and counts, never the text (the UI and run storage have no login)
        {"id": f.id, "subjects": ", ".join(s.canonical_key for s in f.subjects), "importance": f.importance,
         "scope": f.scope, "kind": f.kind, "chars": len(f.text)}
        for f in inserted
    )


def extract_group(rt: FamiliarRuntime, report: ProjectionReport, group: Sequence[Turn], turn_log: TurnLog, *,
                  self_key: str, self_name: str) -> BatchOutcome:
    """One scope's turns of a batch: one model call, its manifest built from that scope alone."""
    prompt_turns = [t for t in group if t.mode != ACTIVITY_RETURN and not t.deleted]
    if not prompt_turns:
        report.drop("activity_return_only_batches")
        return BatchOutcome()
    knobs = rt.config.memory.rich_note
    manifest = build_manifest(group, turn_log, participants_max=knobs.participants_max, self_key=self_key, self_name=self_name)
    messages = extraction_messages(group, manifest, self_key=self_key, self_name=self_name)
    llm_started = time.perf_counter()
    # the reply rests on the turns it quotes and those its participants' labels were read from
    shown = [t.id for t in prompt_turns] + [e.turn_id for e in manifest if e.turn_id is not None]
    with llm_sources(turns=shown):
        reply = rt.llm.complete(messages, json_schema=prompt.REPLY_SCHEMA)
    report.llm_seconds += time.perf_counter() - llm_started
    raw_facts, malformed = prompt.parse_reply(reply.text)
    if not (reply.text or "").strip():
        report.drop("empty_reply")  # not the same as "[]": the model said nothing at all
    report.drop("malformed_items", malformed)
    outcome = validate_facts(raw_facts, group, manifest, self_key=self_key, self_name=self_name)
    scope = turn_scope(group[0])
    drafts = [replace(d, scope=scope) for d in outcome.drafts]
    forgotten = turn_log.forgotten_people()
    outcome.drafts = [d for d in drafts if not about_forgotten(d, forgotten, rt.config.memory.privacy.after_forget)]
    if len(outcome.drafts) < len(drafts):
        outcome.drop("about_forgotten_people", len(drafts) - len(outcome.drafts))
    return outcome


def follow_changes(rt: FamiliarRuntime, report: ProjectionReport, turn_log: TurnLog, *, change_seq: int,
                   watermark: int, self_key: str, self_name: str) -> Followed | None:
    """Follow the turn log's edits and deletions past `change_seq` (see `changes`); None when there were none.

    The edited turns are extracted first (the model calls, with the store closed); then one
    transaction removes what the changed turns produced, adds the new facts and moves the
    watermark's `change_seq`, so a killed run leaves either all of it or none.
    """
    followed = pending_changes(turn_log, change_seq, watermark)
    if followed.change_seq == change_seq:
        return None
    drafts: list[FactDraft] = []
    for turn in followed.to_extract:
        outcome = extract_group(rt, report, [turn], turn_log, self_key=self_key, self_name=self_name)
        drafts.extend(outcome.drafts)
        for reason, n in outcome.dropped.items():
            report.drop(reason, n)
    with rt.store() as store:
        with store.transaction():
            forget_changed(store, followed)
            inserted = [fact for fact, is_new in append_facts(store, drafts) if is_new]
            store.set_watermark(PROJECTOR, change_seq=followed.change_seq)
        rt.publish(store)
    index = rt.fts_facts()
    index.delete_many(followed.facts_removed)
    index.upsert_many((f.id, f.text) for f in inserted)
    if not index.commit():
        report.drop("fts_commit_skipped")
    report.rows_written += len(inserted)
    report.extra["changes_followed"] = (
        f"{len(followed.turns)} changed turn(s): {len(followed.facts_removed)} fact(s) removed "
        f"({', '.join(f'{n} {t}' for t, n in sorted(followed.removed.items()))}), "
        f"{len(followed.facts_restored)} made current again, {len(inserted)} extracted from "
        f"{len(followed.to_extract)} edited turn(s)")
    return followed


def run(rt: FamiliarRuntime, report: ProjectionReport, *, rebuild: bool = False) -> None:
    """Follow edits and deletions (`follow_changes`), then every full batch past the watermark, up to `max_batches_per_run`."""
    cfg = rt.config
    knobs = cfg.memory.rich_note
    self_key, self_name = ego_key(cfg.familiar_id), cfg.display_name
    turn_log = rt.turn_log()
    with rt.store() as store:
        if rebuild:
            rt.fts_facts().clear()
            rt.fts_facts().commit()
        mark = store.get_watermark(PROJECTOR)
        watermark = mark.turn_id
        all_facts = fact_texts(store)
    if rt.fts_facts().doc_count() != len(all_facts):
        # a killed run or a skipped commit left fts/facts out of step: the store is canonical
        rt.fts_facts().rebuild(all_facts)
        report.extra["fts_facts_repaired"] = f"reindexed {len(all_facts)} facts from the store"
    report.watermark_before = {"turn_id": watermark, "change_seq": mark.change_seq}
    followed = follow_changes(rt, report, turn_log, change_seq=mark.change_seq, watermark=watermark,
                              self_key=self_key, self_name=self_name)
    pending: list[tuple[int, BatchOutcome]] = []
    group_started = time.monotonic()
    for _ in range(cfg.pipeline.max_batches_per_run):
        batch = next_batch(turn_log, watermark, knobs.batch_size, knobs.quiet_s)
        if not batch:
            break
        report.batches += 1
        report.turns_read += len(batch)
        outcome = BatchOutcome()
        for group in scope_groups(batch):
            found = extract_group(rt, report, group, turn_log, self_key=self_key, self_name=self_name)
            outcome.drafts.extend(found.drafts)
            for reason, n in found.dropped.items():
                outcome.drop(reason, n)
        for reason, n in outcome.dropped.items():
            report.drop(reason, n)
        watermark = batch[-1].id
        pending.append((watermark, outcome))
        if len(pending) >= WRITE_GROUP_BATCHES or time.monotonic() - group_started >= WRITE_GROUP_SECONDS:
            write_outcomes(rt, report, pending)
            pending, group_started = [], time.monotonic()
    write_outcomes(rt, report, pending)
    report.watermark_after = {"turn_id": watermark,
                              "change_seq": followed.change_seq if followed else mark.change_seq}
    if report.batches == 0 and followed is None:
        report.no_op(f"fewer than batch_size={knobs.batch_size} new turns and no quiet gap of quiet_s={knobs.quiet_s}")
