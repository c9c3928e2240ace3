"""An hour of scripted chat through both sensors, counting the runs they launch.

Every run the turn-watermark sensor or the automation sensor requests is executed
in-process against a test instance, as the daemon would, and its materializations
are read back, per familiar the run served (one run may serve both). The target: no
familiar's part of a run reads 0 turns and writes 0 rows, except the first run of a
familiar without a model, which reports "skipped" with the setting.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest

from familiar_pipeline.definitions import defs, fact_automation_sensor
from familiar_pipeline.defs.assets import FACT_DRIVEN, MEMORY
from familiar_pipeline.defs.jobs import execute_request
from familiar_pipeline.defs.sensors import build_turn_watermark_sensor
from familiar_pipeline.storage.turns import TurnLog
from familiar_pipeline.testing.fake_llm import fake_llm
from familiar_pipeline.testing.scripted import careful_model

from .helpers import FAKE_MODEL_TOML, LINES, PEOPLE, make_familiar

TICKS = 12  # one sensor tick per five simulated minutes


def chat_minute(paths, minute: int, started: datetime) -> None:
    """A conversation with lulls: a few lines most minutes, none in some."""
    count = (0, 1, 3, 0, 2, 4)[minute % 6]
    with TurnLog(paths.turns_db) as log:
        for i in range(count):
            key, name = PEOPLE[(minute + i) % len(PEOPLE)]
            log.upsert_participant(key, username=name.lower(), global_name=name)
            log.append_turn(channel_id=10, guild_id=1, role="user", author_key=key, author_display=name,
                            content=f"{LINES[(minute + i) % len(LINES)]} (m{minute})",
                            created_at=started + timedelta(minutes=minute, seconds=10 * i))


def execute(instance, root, request: dg.RunRequest, trigger: str) -> list[dict]:
    """Run one request as the daemon would; per familiar it served, what each asset read and wrote.

    The turn sensor's request covers a partition range (its tags) with a per-asset plan (its
    run config); a familiar in the range but outside the plan gets no materialization.
    """
    result = execute_request(request, instance=instance, data_root=root, tags={"trigger": trigger})
    assert result.success
    out: dict[str, dict] = {}
    for event in result.get_asset_materialization_events():
        m = event.materialization
        meta = {k: v.value for k, v in m.metadata.items()}
        out.setdefault(m.partition, {})[m.asset_key.path[-1]] = (meta["status"], int(meta["turns_read"]), int(meta["rows_written"]))
    return [{"partition": p, "trigger": trigger, "assets": assets} for p, assets in sorted(out.items())]


def automation_requests(result) -> list[dg.RunRequest]:
    """The automation sensor's requests as the daemon launches them: one run per partition."""
    by_partition: dict[str, list] = {}
    for key in FACT_DRIVEN:
        for partition in result.get_requested_partitions(key):
            by_partition.setdefault(partition, []).append(key)
    return [dg.RunRequest(partition_key=p, asset_selection=keys) for p, keys in sorted(by_partition.items())]


@pytest.mark.timeout(600)
def test_an_hour_of_chat_launches_no_run_that_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FAMILIAR_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("FAMILIAR__PIPELINE__INDEX_QUIET_S", "0")
    online = make_familiar(tmp_path, "online", FAKE_MODEL_TOML)
    offline = make_familiar(tmp_path, "offline", "")
    sensor = build_turn_watermark_sensor([MEMORY])
    started = datetime.now(timezone.utc) - timedelta(hours=1)
    runs: list[dict] = []
    with fake_llm(careful_model), dg.instance_for_test() as instance:
        cursor, auto_cursor = None, None
        for tick in range(TICKS):
            for minute in range(5 * tick, 5 * tick + 5):
                chat_minute(online, minute, started)
                chat_minute(offline, minute, started)
            result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
            cursor = result.cursor
            for request in result.dynamic_partitions_requests:
                instance.add_dynamic_partitions("familiars", list(request.partition_keys))
            for request in result.run_requests:
                runs.extend(execute(instance, tmp_path, request, "turn_watermark_sensor"))
            automation = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=auto_cursor)
            auto_cursor = automation.cursor
            for request in automation_requests(automation):
                runs.extend(execute(instance, tmp_path, request, fact_automation_sensor.name))

    def does_nothing(run) -> bool:
        return all(read == 0 and written == 0 for _, read, written in run["assets"].values())

    noops = [r for r in runs if does_nothing(r)]
    skipped = [r for r in noops if r["partition"] == "offline"
               and all(s.startswith(("skipped", "disabled")) for s, _, _ in r["assets"].values())]
    report = "\n".join(f"{r['partition']} {r['trigger']}: " + ", ".join(
        f"{name} {status.split(':')[0]} read {read} wrote {wrote}" for name, (status, read, wrote) in r["assets"].items())
        for r in runs)
    assert len(skipped) <= 1, report
    assert [r for r in noops if r not in skipped] == [], report
    online_runs = [r for r in runs if r["partition"] == "online"]
    written = sum(w for r in online_runs for name, (_, _, w) in r["assets"].items() if name == "facts")
    assert written >= 40, report  # the hour's facts were extracted
    offline_llm = [r for r in runs if r["partition"] == "offline" and "facts" in r["assets"]]
    assert len(offline_llm) == 1 and offline_llm[0]["assets"]["facts"][0].startswith("skipped"), report
    assert any(r["partition"] == "offline" and "turns_fts" in r["assets"] for r in runs[1:]), "the index still follows"
    automated = [r for r in runs if r["trigger"] == fact_automation_sensor.name]
    print(f"{len(runs)} runs over {TICKS} ticks: {len(online_runs)} online, {len(runs) - len(online_runs)} offline, "
          f"{len(automated)} by automation, {len(noops)} that read and wrote nothing")
