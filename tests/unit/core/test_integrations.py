"""Unit tests for pipeline.core.integrations: the integrations map of a call (seed §4.3 rule 6)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.integrations import is_enabled


@pytest.mark.parametrize(
    ("integrations", "enabled"),
    [
        (None, True),  # default: every destination on
        ({}, True),
        ({"All": True}, True),
        ({"All": False}, False),
        ({"All": False, "Webhooks": True}, True),
        ({"All": False, "Webhooks": False}, False),
        ({"All": True, "Webhooks": False}, False),
        ({"Webhooks": False}, False),
        ({"Webhooks": True}, True),
        ({"Webhooks": {}}, True),  # an object of options means on
        ({"Webhooks": {"option": 1}}, True),
        ({"All": False, "Webhooks": {"option": 1}}, True),
        # keys are case-sensitive: these do not name the destination "Webhooks"
        ({"webhooks": False}, True),
        ({"WEBHOOKS": False}, True),
        ({"All": False, "webhooks": True}, False),
        ({"all": False}, True),
        # keys naming other destinations are ignored
        ({"Google Analytics": False}, True),
        ({"All": False, "Google Analytics": True}, False),
    ],
)
def test_is_enabled(integrations: dict[str, Any] | None, enabled: bool) -> None:
    assert is_enabled(integrations, "Webhooks") is enabled


def test_the_destination_name_is_the_key() -> None:
    integrations = {"All": False, "Hooks EU": True, "Webhooks": False}
    assert is_enabled(integrations, "Hooks EU") is True
    assert is_enabled(integrations, "Webhooks") is False
    assert is_enabled(integrations, "Hooks US") is False
    assert is_enabled({"Hooks EU": False}, "Hooks US") is True
