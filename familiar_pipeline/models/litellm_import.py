"""Importing litellm: offline, quiet, once per process.

Its own module so that both the client (`familiar_pipeline.models.llm`) and the
scripted offline provider (`familiar_pipeline.testing.fake_llm`), which the
client installs for ``fake/`` models, import it from below them.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

_litellm_lock = threading.Lock()
_litellm_module: Any = None


def import_litellm() -> Any:
    """Import litellm offline and quiet, once per process.

    The cost map env var must be set before the first import or litellm fetches
    pricing over the network. Debug banners and verbose logging are turned off so
    a failing call produces our one scrubbed error instead of pages of noise.
    """
    global _litellm_module
    if _litellm_module is not None:
        return _litellm_module
    with _litellm_lock:
        if _litellm_module is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm

            litellm.suppress_debug_info = True
            litellm.set_verbose = False
            litellm.turn_off_message_logging = True
            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
                logging.getLogger(name).setLevel(logging.WARNING)
            _litellm_module = litellm
    return _litellm_module
