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


CONSOLE_PLATFORM = "console"


def console_slug(name: str) -> str:
    """The user id of a console speaker called `name` ("" when it has no letter or digit)."""
    return re.sub(r"[^a-z0-9_.-]+", "-", " ".join(name.split()).lower()).strip("-")


def ego_key(familiar_id: str) -> str:
    return f"{EGO_PREFIX}{familiar_id}"


def is_ego_key(key: str) -> bool:
    return isinstance(key, str) and key.startswith(EGO_PREFIX) and len(key) > len(EGO_PREFIX)


def check_key(key: object, what: str = "canonical key") -> str:
    """``key`` unchanged if it is a well-formed canonical key, else a ValueError naming ``what``.

    Well-formed: a string ``platform:user_id`` (or ``ego:<id>``) with both parts
    non-empty, no whitespace anywhere, and encodable as UTF-8 (no lone
    surrogates), so it can be stored in SQLite and DuckDB alike.
    """
    if not isinstance(key, str):
        raise ValueError(f"{what} must be a string like 'discord:1234', got {type(key).__name__}")
    platform, sep, user = key.partition(":")
    if not sep or not platform or not user or any(c.isspace() for c in key):
        raise ValueError(f"malformed {what} {key!r}; expected 'platform:user_id'")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"malformed {what} {key!r}: it holds a lone UTF-16 surrogate") from None
    return key


def split_key(key: str) -> tuple[str, str]:
    """``"discord:42"`` -> ``("discord", "42")``; raises on a malformed key."""
    platform, sep, user = key.partition(":")
    if not sep or not platform or not user:
        raise ValueError(f"malformed canonical key {key!r}; expected 'platform:user_id'")
    return platform, user
