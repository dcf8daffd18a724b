"""Where settings come from: defaults, a settings file, the environment, command-line flags.

Each later source wins: a flag over the environment, the environment over the file
(``PIPELINE_SETTINGS_FILE``: ``PIPELINE_NAME=value`` lines, as ``docker compose``'s ``env_file``
and systemd's ``EnvironmentFile`` read them), the file over the defaults. A Kafka properties
file (``PIPELINE_KAFKA_CONFIG``) fills the cluster address and the Schema Registry where nothing
else did. ``load_settings`` says where each value came from, for ``pipeline settings``.

    >>> loaded = load_settings({"PIPELINE_PARTITIONS": "12"}, flags={"topic_prefix": "t."})
    >>> loaded.origins["partitions"], loaded.origins["topic_prefix"], loaded.origins["log"]
    ('environment', 'flag', 'default')
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_settings import DotEnvSettingsSource, EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from pipeline.core.settings import PREFIX, Settings, SettingsError, describe_errors, env_name

__all__ = ["LoadedSettings", "load_settings", "SETTINGS_FILE"]

#: The variable naming the settings file.
SETTINGS_FILE = "PIPELINE_SETTINGS_FILE"


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._given = environ
        super().__init__(Settings, case_sensitive=False, env_ignore_empty=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._given, False, True, None)


@dataclass(frozen=True)
class LoadedSettings:
    """Settings and where each value came from: ``default``, ``file PATH``, ``environment``,
    ``flag``, a Kafka properties file's line, or a change made after loading."""

    settings: Settings
    origins: dict[str, str]
    file: str | None = None
    notes: tuple[str, ...] = field(default=())

    def with_changes(self, why: str, **changes: Any) -> LoadedSettings:
        """These settings with ``changes``, noted as made for ``why``."""
        origins = {**self.origins, **dict.fromkeys(changes, why)}
        return LoadedSettings(self.settings.replace(**changes), origins, self.file, self.notes)


def load_settings(
    environ: Mapping[str, str] | None = None,
    *,
    file: str | None = None,
    flags: Mapping[str, Any] | None = None,
) -> LoadedSettings:
    """The settings of ``environ`` (default ``os.environ``), the settings file (``file``, else
    ``PIPELINE_SETTINGS_FILE``) and ``flags`` (setting name → value).

    ``SettingsError`` lists every problem, each naming the variable and its source.
    """
    env = os.environ if environ is None else environ
    path = file or env.get(SETTINGS_FILE) or None
    from_file = _read_file(path) if path else {}
    from_env = _Environment(env)()
    given = {**from_file, **from_env, **(flags or {})}
    origins = {name: "default" for name in Settings.model_fields}
    origins.update(dict.fromkeys(from_file, f"file {path}"))
    origins.update(dict.fromkeys(from_env, "environment"))
    origins.update(dict.fromkeys(flags or {}, "flag"))
    try:
        settings = Settings(**given)
    except SettingsError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ValidationError):
            raise SettingsError(describe_errors(cause, origins)) from None
        raise SettingsError([_with_origin(p, origins) for p in exc.problems]) from None
    client = settings.kafka_client
    for name in settings.model_fields_set - set(given):
        # Filled from the Kafka properties file (cluster address, Schema Registry).
        source = client.registry.get(name) or (
            client.bootstrap_servers if name == "bootstrap_servers" else None
        )
        origins[name] = source.origin if source is not None else "kafka properties"
    return LoadedSettings(settings, origins, path, client.notes)


def _with_origin(problem: str, origins: Mapping[str, str]) -> str:
    name = problem.split(":", 1)[0]
    field = name.removeprefix(PREFIX).lower()
    origin = origins.get(field, "")
    if origin.startswith("file ") and name.startswith(PREFIX):
        return f"{name} (from {origin}){problem[len(name) :]}"
    return problem


def _read_file(path: str) -> dict[str, Any]:
    """The settings of a ``PIPELINE_NAME=value`` file; an unknown name is an error that
    suggests the closest one."""
    from dotenv import dotenv_values

    if not os.path.isfile(path):
        raise SettingsError([f"{SETTINGS_FILE}: {path} does not exist"])
    try:
        names = dotenv_values(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError([f"{SETTINGS_FILE}: cannot read {path}: {exc}"]) from None
    known = {env_name(name): name for name in Settings.model_fields}
    problems = []
    with open(path, encoding="utf-8") as text:
        lines = {
            line.split("=", 1)[0].strip().removeprefix("export "): number
            for number, line in enumerate(text, 1)
            if "=" in line and not line.lstrip().startswith("#")
        }
    for name, value in names.items():
        where = f"{path} line {lines.get(name, '?')}"
        if name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(f"{where}: {name} is not a setting{hint}")
        elif value is None:
            problems.append(f"{where}: {name} has no value (write {name}=VALUE)")
    if problems:
        raise SettingsError(problems)
    source = DotEnvSettingsSource(
        Settings, env_file=path, case_sensitive=False, env_ignore_empty=True
    )
    return dict(source())
