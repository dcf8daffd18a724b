"""Snake-casing of audience and computed-trait names (seed §6.2)."""

from __future__ import annotations

import pytest

from pipeline.core.snake import MAX_PROPERTY_CHARS, property_name, snake_case


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # the seed's example: digits stay with the letters after them
        ("Order Completed Last 30days", "order_completed_last_30days"),
        # spaces: runs collapse, ends vanish
        ("  Total   Orders ", "total_orders"),
        # punctuation separates words
        ("Orders > $100 (last 7 days)!", "orders_100_last_7_days"),
        ("a_b-c.d/e", "a_b_c_d_e"),
        ("__already_snake__", "already_snake"),
        # apostrophes are dropped, not separators
        ("Customer's Orders", "customers_orders"),
        ("Customer\u2019s Orders", "customers_orders"),
        # camelCase and PascalCase
        ("orderCompleted", "order_completed"),
        ("OrderCompletedLast30Days", "order_completed_last30_days"),
        ("iPhone Users", "i_phone_users"),
        # acronyms
        ("HTTPServer errors", "http_server_errors"),
        ("VIP", "vip"),
        ("VIPCustomers", "vip_customers"),
        # digits
        ("Top 10", "top_10"),
        ("top10users", "top10users"),
        ("30days", "30days"),
        ("Version2Beta", "version2_beta"),
        ("2024 Buyers", "2024_buyers"),
        # letters outside ASCII are kept, lowercased; NFC first
        ("Café Visitors", "café_visitors"),
        ("Cafe\u0301 Visitors", "café_visitors"),
        ("Ünïcode Größe", "ünïcode_größe"),
        # nothing usable
        ("", ""),
        ("!!! --- ???", ""),
    ],
)
def test_snake_case(name: str, expected: str) -> None:
    assert snake_case(name) == expected


def test_snake_case_is_idempotent() -> None:
    for name in ("Order Completed Last 30days", "HTTPServer errors", "iPhone Users"):
        once = snake_case(name)
        assert snake_case(once) == once


@pytest.mark.parametrize("name", ["", "   ", "!!!", "''", "- _ -"])
def test_property_name_rejects_names_without_letters_or_digits(name: str) -> None:
    with pytest.raises(ValueError, match="--name: .* snake_case property name is empty"):
        property_name(name)


def test_property_name_rejects_overlong_names() -> None:
    assert property_name("a" * MAX_PROPERTY_CHARS) == "a" * MAX_PROPERTY_CHARS
    with pytest.raises(ValueError, match=f"over the limit of {MAX_PROPERTY_CHARS}"):
        property_name("a" * (MAX_PROPERTY_CHARS + 1))
