"""The projection engine: what every projector plugs into and what runs them, without Dagster.

`spec.py` is the protocol a projector plugs in through (`ProjectorSpec`: its knobs, tables,
trigger, run function and checks); `registry.py` holds the registered specs (the built-ins
come through an entry point, `projectors/builtin.py`, so the engine imports no projector);
`runtime.py` is what a projector runs with for one familiar (writer lock, store, model,
indexes, publish); `report.py` what it reports; `schedule.py` decides what runs when (the
step's work order, the turn sensor's due assets); `run_loop.py` runs the step's work order
(each familiar through its projectors, their checks, the erasure purge, the publish). `defs/`
turns those into Dagster assets, check evaluations and run requests, and hands the loop what
only it has (the resources that open a familiar, the checks) through small protocols.

The helpers only projectors use stay with them in `projectors/`: `prompting.py` (prompt
rendering and the scripted model's parsing), `vectors.py` (the embedding projectors' shared
spec, rows and reads, which the bot reads too) and `horizon.py` (the facts as they stood at
a turn, built on the facts' table): the engine runs projectors, it does not build prompts,
vectors or facts.
"""
