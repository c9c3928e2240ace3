"""Participant identity: canonical keys.

A person is their platform account, ``<platform>:<user_id>`` (``discord:1234``),
never a name they use in conversation; the familiar itself is ``ego:<familiar_id>``.
Names are display snapshots and can change; keys never do.
"""

from __future__ import annotations

import re

EGO_PREFIX = "ego:"
_PLATFORM = re.compile(r"^[a-z][a-z0-9_-]*$")


def canonical_key(platform: str, user_id: str | int) -> str:
    platform = str(platform).strip().lower()
    user = str(user_id).strip()
    if not _PLATFORM.match(platform) or platform == "ego":
        raise ValueError(f"invalid platform {platform!r} for a canonical key")
    if not user or ":" in user or any(c.isspace() for c in user):
        raise ValueError(f"invalid user id {user_id!r} for a canonical key")
    return f"{platform}:{user}"


def ego_key(familiar_id: str) -> str:
    return f"{EGO_PREFIX}{familiar_id}"


def is_ego_key(key: str) -> bool:
    return isinstance(key, str) and key.startswith(EGO_PREFIX) and len(key) > len(EGO_PREFIX)


def split_key(key: str) -> tuple[str, str]:
    """``"discord:42"`` -> ``("discord", "42")``; raises on a malformed key."""
    platform, sep, user = key.partition(":")
    if not sep or not platform or not user:
        raise ValueError(f"malformed canonical key {key!r}; expected 'platform:user_id'")
    return platform, user
