"""Unit tests for ``pipeline config export``'s file (``format_export``), ``config apply``'s warning
about overwriting changes made outside it, and ``config show``'s "changed by" — without a broker."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import yaml
from hypothesis import given, settings

from pipeline.commands.config import (
    _write_private,
    format_config,
    format_export,
    overwrite_warning,
)
from pipeline.core.config import (
    ConfigTable,
    Destination,
    Ordering,
    Source,
    Webhook,
    validate_config,
)
from pipeline.kafka.config_store import Origin

from ..core._config_tables import config_tables

AT = 1_795_471_265_123  # 2026-11-23T22:01:05.123Z


def exported(table: ConfigTable) -> str:
    return format_export(
        table, exported_at=AT, bootstrap_servers="kafka-1:9092", topic="prod.config"
    )


def applied(text: str) -> ConfigTable:
    config = validate_config(yaml.safe_load(text))
    return ConfigTable.build(config.sources, config.destinations)


@settings(max_examples=200, deadline=None)
@given(config_tables())
def test_the_exported_file_applies_to_the_same_config(table: ConfigTable) -> None:
    assert applied(exported(table)) == table


def test_a_name_with_a_next_line_character_survives() -> None:
    """PyYAML writes U+0085 raw unless double-quoted, and reads it back as a line break."""
    table = ConfigTable.build([Source(id="web", name="a\x85b", blocked_events=["\x85"])], [])
    assert applied(exported(table)) == table


def test_the_file_starts_with_when_and_where_it_was_exported() -> None:
    header, *_ = exported(ConfigTable.build((), ())).splitlines()
    assert header == (
        "# pipeline config export at 2026-11-23T22:01:05Z from topic prod.config "
        "at kafka-1:9092; holds secrets"
    )


def test_the_file_reads_like_the_documented_example() -> None:
    dest = Destination(
        id="hooks-1",
        sources=["web"],
        shared_secret="s3cret",
        webhooks=[Webhook(url="https://example.com/hook", headers={"Authorization": "Bearer abc"})],
        disable_after=86_400.0,
    )
    table = ConfigTable.build([Source(id="web", name="Website", write_keys=["wk_live_1"])], [dest])
    assert exported(table).splitlines()[1:] == [
        "sources:",
        "- id: web",
        "  name: Website",
        "  write_keys: [wk_live_1]",
        "destinations:",
        "- id: hooks-1",
        "  name: Webhooks",
        "  enabled: true",
        "  sources: [web]",
        "  shared_secret: s3cret",
        "  webhooks:",
        "  - url: https://example.com/hook",
        "    headers: {Authorization: Bearer abc}",
        "  disable_after: 1d",
    ]


def test_an_ordered_destination_exports_its_ordering_and_applies_unchanged() -> None:
    dest = Destination(
        id="hooks",
        sources=["web"],
        webhooks=[Webhook(url="https://example.com/")],
        ordering=Ordering.PER_USER,
    )
    table = ConfigTable.build([Source(id="web")], [dest])
    text = exported(table)
    assert "  ordering: per_user" in text.splitlines()
    assert applied(text) == table
    plain = ConfigTable.build(
        [Source(id="web")], [dest.model_copy(update={"ordering": Ordering.NONE})]
    )
    assert "ordering" not in exported(plain)  # the default is left out


def test_an_export_file_is_private_even_when_it_existed(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("old and longer than the new text\n")
    path.chmod(0o644)
    _write_private(str(path), "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_the_overwrite_warning_names_the_entity_who_and_when() -> None:
    console = Origin("console:ab12", AT)
    assert overwrite_warning("destination:hooks", console, deleting=False) == (
        "destination:hooks was changed by console:ab12 at 2026-11-23T22:01:05Z since the last "
        "apply; applying overwrites that change"
    )
    assert overwrite_warning("source:web", Origin("pipeline", None), deleting=True) == (
        "source:web was changed by pipeline since the last apply; applying deletes it"
    )


TABLE = ConfigTable.build(
    [Source(id="web")],
    [Destination(id="hooks", sources=["web"], webhooks=[Webhook(url="https://example.com/")])],
)
ORIGINS = {"source:web": Origin(None, None), "destination:hooks": Origin("console:ab12", AT)}


def test_config_show_says_who_changed_an_entity_last() -> None:
    lines = format_config(TABLE, origins=ORIGINS).splitlines()
    hooks = next(i for i, line in enumerate(lines) if line.startswith("hooks "))
    assert lines[hooks + 2] == "  changed by console:ab12 at 2026-11-23T22:01:05Z"
    web = next(i for i, line in enumerate(lines) if line.startswith("web "))
    assert lines[web + 1] == ""  # written before origins were kept: nothing to say
    shown = orjson.loads(format_config(TABLE, origins=ORIGINS, as_json=True))
    assert (shown["destinations"][0]["changed_by"], shown["destinations"][0]["changed_at"]) == (
        "console:ab12",
        AT,
    )
    assert shown["sources"][0]["changed_by"] is None
