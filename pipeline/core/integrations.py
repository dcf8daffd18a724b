"""The ``integrations`` map of a call (seed §4.3 rule 6).

By default every destination is on. ``"All": false`` turns off every destination not itself set to
true. A destination's own key (its ``name``, case-sensitive) set to ``false`` turns it off, and set to
``true`` or to an object of options turns it on. Keys that name no destination are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["is_enabled"]


def is_enabled(integrations: Mapping[str, object] | None, destination_name: str) -> bool:
    """Whether a call with this ``integrations`` map goes to the destination named so.

    >>> is_enabled({"All": False, "Webhooks": True}, "Webhooks")
    True
    >>> is_enabled({"All": False}, "Webhooks")
    False
    """
    if not integrations:
        return True
    own = integrations.get(destination_name)
    if own is not None:
        return own is not False
    return integrations.get("All") is not False
