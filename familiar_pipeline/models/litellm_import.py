"""Importing litellm: offline, quiet, once per process.

Its own module so that both the client (`familiar_pipeline.models.llm`) and the
scripted offline provider (`familiar_pipeline.testing.fake_llm`), which the
client installs for ``fake/`` models, import it from below them.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

_litellm_lock = threading.RLock()
_litellm_module: Any = None  # set once litellm is imported and every on-import callback has run
_importing: Any = None  # litellm while its on-import callbacks run (they may ask for it again)
_on_import: list[Callable[[], None]] = []


def when_imported(callback: Callable[[], None]) -> None:
    """Call `callback` once litellm is imported: now if it is, else during the first import.

    Lets setup that needs litellm (the scripted provider's registration) wait until a
    model call is actually due, so a run that calls no model never pays litellm's import.
    No caller gets litellm before the callbacks have run.
    """
    with _litellm_lock:
        if _litellm_module is None:
            _on_import.append(callback)
            return
    callback()


def import_litellm() -> Any:
    """Import litellm offline and quiet, once per process.

    The cost map env var must be set before the first import or litellm fetches
    pricing over the network. Debug banners and verbose logging are turned off so
    a failing call produces our one scrubbed error instead of pages of noise.
    """
    global _litellm_module, _importing
    if _litellm_module is not None:
        return _litellm_module
    with _litellm_lock:
        if _litellm_module is not None:
            return _litellm_module
        if _importing is not None:  # asked again by an on-import callback, in this thread
            return _importing
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.suppress_debug_info = True
        litellm.set_verbose = False
        litellm.turn_off_message_logging = True
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
            logging.getLogger(name).setLevel(logging.WARNING)
        _importing = litellm
        try:
            while _on_import:
                _on_import.pop(0)()
        finally:
            _importing = None
        _litellm_module = litellm
    return _litellm_module
