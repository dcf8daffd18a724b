"""``config export`` and ``config apply`` against a real broker, with the console writing too:
an export applies unchanged, and apply does not silently overwrite a change made outside it."""

from __future__ import annotations

import os
import pty
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.config import Destination
from pipeline.core.settings import Settings
from pipeline.kafka.config_store import load_config, write_config
from tests.support import ROOT, apply, settings_env, simple_config

URL = "http://127.0.0.1:9/hook"  # never called: no worker runs here

#: Every field of a destination set, and a second source.
FULL: dict[str, Any] = {
    "sources": [
        {"id": "web", "name": "Website", "write_keys": ["wk"], "blocked_events": ["Debug Event"]},
        {"id": "ios", "name": "iOS app", "write_keys": ["wk_ios"]},
    ],
    "destinations": [
        {
            "id": "hooks",
            "name": "Webhooks",
            "enabled": False,
            "sources": ["web", "ios"],
            "shared_secret": "s3cret",
            "standard_webhooks": True,
            "webhooks": [
                {"url": URL, "headers": {"Authorization": "Bearer abc"}},
                {"url": "http://127.0.0.1:9/second"},
            ],
            "retry": {"delays": ["10s", "1m", 1.0004], "deadline": "4h"},
            "max_in_flight": 200,
            "rate_limit": 2.5,
            "disable_after": "24h",
            "ordering": "per_user",
            "disabled_reason": "every attempt failed for 1d (disable_after 1d)",
            "disabled_at": 1_795_273_500_000,
        },
        {"id": "plain", "sources": ["web"], "webhooks": [{"url": URL}]},
    ],
}


def config_cli(
    settings: Settings, *args: str, tmp_path: Path, config: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """``pipeline config ARGS``; with ``config``, its file is written and passed last."""
    if config is not None:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        args = (*args, str(path))
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "config", *args],
        capture_output=True,
        text=True,
        env=settings_env(settings),
        timeout=60,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,  # no terminal: apply cannot ask
    )


def live_destination(settings: Settings, ident: str = "hooks") -> tuple[Destination, str | None]:
    table, origins = load_config(settings)
    return table.destinations[ident], origins[f"destination:{ident}"].changed_by


def test_an_export_applies_with_every_entity_unchanged(settings, tmp_path):
    apply(settings, FULL)
    result = config_cli(settings, "export", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# pipeline config export at ")
    assert settings.bootstrap_servers in result.stdout.splitlines()[0]
    exported = tmp_path / "exported.yaml"
    exported.write_text(result.stdout)

    again = config_cli(settings, "apply", str(exported), tmp_path=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["0 created, 0 updated, 0 deleted, 4 unchanged"]


def test_an_export_to_a_file_is_private_and_says_what_it_wrote(settings, tmp_path):
    apply(settings, FULL)
    target = tmp_path / "live.yaml"
    result = config_cli(settings, "export", "--output", str(target), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"wrote 2 sources and 2 destinations to {target} (mode 0600: it holds secrets)\n"
    )
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert "shared_secret: s3cret" in target.read_text()


def test_apply_refuses_to_overwrite_a_console_change_unless_forced(settings, tmp_path):
    apply(settings, simple_config(URL))
    before, _ = live_destination(settings)
    toggled = before.model_copy(update={"enabled": False})
    write_config(settings, [toggled], changed_by="console:test")
    assert live_destination(settings) == (toggled, "console:test")
    moved = simple_config("http://127.0.0.1:9/moved")  # enabled, and a new URL

    refused = config_cli(settings, "apply", tmp_path=tmp_path, config=moved)
    assert refused.returncode == 1, refused.stderr
    [warning] = [line for line in refused.stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: destination:hooks was changed by console:test at 20")
    assert warning.endswith("since the last apply; applying overwrites that change")
    assert "nothing was written" in refused.stderr
    assert "--force" in refused.stderr
    assert refused.stdout == ""
    assert live_destination(settings) == (toggled, "console:test")

    dry = config_cli(settings, "apply", "--dry-run", tmp_path=tmp_path, config=moved)
    assert dry.returncode == 0, dry.stderr
    assert warning in dry.stderr.splitlines()
    assert "would update" in dry.stdout
    assert live_destination(settings) == (toggled, "console:test")

    forced = config_cli(settings, "apply", "--force", tmp_path=tmp_path, config=moved)
    assert forced.returncode == 0, forced.stderr
    assert warning in forced.stderr.splitlines()
    assert "1 updated" in forced.stdout
    after, changed_by = live_destination(settings)
    assert (after.enabled, after.webhooks[0].url, changed_by) == (
        True,
        "http://127.0.0.1:9/moved",
        "apply",
    )


def test_apply_warns_before_deleting_a_console_change(settings, tmp_path):
    apply(settings, FULL)
    table, _ = load_config(settings)
    write_config(settings, [table.destinations["plain"]], changed_by="console:test")
    without_plain = {**FULL, "destinations": FULL["destinations"][:1]}
    refused = config_cli(settings, "apply", tmp_path=tmp_path, config=without_plain)
    assert refused.returncode == 1, refused.stderr
    assert "destination:plain was changed by console:test" in refused.stderr
    assert "applying deletes it" in refused.stderr
    assert "plain" in load_config(settings)[0].destinations


def test_apply_leaving_a_console_change_as_it_is_warns_nothing(settings, tmp_path):
    apply(settings, simple_config(URL))
    before, _ = live_destination(settings)
    write_config(
        settings, [before.model_copy(update={"enabled": False})], changed_by="console:test"
    )
    kept = simple_config(URL, enabled=False)  # the file now says what the console did
    result = config_cli(settings, "apply", tmp_path=tmp_path, config=kept)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
    assert result.stdout.splitlines() == ["0 created, 0 updated, 0 deleted, 2 unchanged"]
    assert live_destination(settings)[1] == "console:test"


def test_apply_on_a_terminal_asks_before_overwriting(settings, tmp_path):
    apply(settings, simple_config(URL))
    before, _ = live_destination(settings)
    write_config(
        settings, [before.model_copy(update={"enabled": False})], changed_by="console:test"
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(simple_config(URL)))

    def on_a_terminal(answer: bytes) -> subprocess.CompletedProcess[str]:
        controller, terminal = pty.openpty()
        try:
            os.write(controller, answer)
            return subprocess.run(
                [sys.executable, "-m", "pipeline", "config", "apply", str(path)],
                stdin=terminal,
                capture_output=True,
                text=True,
                env=settings_env(settings),
                timeout=60,
                cwd=ROOT,
            )
        finally:
            os.close(terminal)
            os.close(controller)

    declined = on_a_terminal(b"n\n")
    assert declined.returncode == 1, declined.stderr
    assert "overwrite? [y/N]" in declined.stderr
    assert live_destination(settings)[1] == "console:test"

    accepted = on_a_terminal(b"y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert "1 updated" in accepted.stdout
    assert live_destination(settings) == (before, "apply")


def test_config_show_says_who_changed_each_entity(settings, tmp_path):
    apply(settings, simple_config(URL))
    before, _ = live_destination(settings)
    write_config(
        settings, [before.model_copy(update={"enabled": False})], changed_by="console:test"
    )
    shown = config_cli(settings, "show", tmp_path=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "  changed by console:test at 20" in shown.stdout
    assert "  changed by apply at 20" in shown.stdout
