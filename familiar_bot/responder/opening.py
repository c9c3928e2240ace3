"""The real responder of a familiar, wired: its turn log, memory view, assembler and reply model.

What ``familiar up``, ``familiar chat``, ``familiar bot`` and the answer evaluation start; a
test builds a :class:`~familiar_bot.responder.flow.Responder` from its own parts instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from familiar_pipeline.config import FamiliarConfig
from familiar_pipeline.models.embedders import create_embedder
from familiar_pipeline.models.llm import client_for
from familiar_pipeline.storage.paths import FamiliarPaths
from familiar_pipeline.storage.turns import TurnLog

from familiar_bot.prompt.assembly import build_assembler
from familiar_bot.prompt.memory_view import MemoryView
from familiar_bot.responder.flow import Responder

log = logging.getLogger(__name__)


@dataclass
class ResponderHandle:
    """A responder plus what must be closed when the transport stops."""

    responder: Responder
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - closing is best effort at exit
                log.exception("closing a resource of the responder failed")


def open_responder(paths: FamiliarPaths, config: FamiliarConfig) -> ResponderHandle:
    """The real responder for a familiar: its turn log, memory readers, assembler and reply model.

    The memory view reads through the responder's own turn-log connection, so a
    turn appended a moment ago is visible to the assembly that follows.
    """
    turn_log = TurnLog(paths.turns_db)
    handle = ResponderHandle(responder=None, closers=[turn_log.close])  # type: ignore[arg-type]
    try:
        memory = MemoryView(paths, config, embedder=create_embedder(config.embedding), turn_log=turn_log)
        handle.closers.append(memory.close)
        assembler = build_assembler(paths, config, memory=memory)
        llm = client_for(
            config.llm, "reply", cache_path=paths.llm_cache, familiar_id=paths.familiar_id
        )
    except BaseException:
        handle.close()
        raise
    llm.warm_up()  # the model client's import, in the background: the first reply need not wait for it
    handle.responder = Responder(paths, config, assembler=assembler, llm=llm, turn_log=turn_log)
    handle.closers.append(handle.responder.close_spool)  # closers run last first: before the log closes
    return handle
