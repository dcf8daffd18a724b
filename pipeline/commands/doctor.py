"""``pipeline doctor [--json]``: check the settings against the real cluster; say what to fix.

Exit 0 when every check passes (or does not apply), 1 when one fails, 2 when the settings
themselves are wrong. ``--json`` prints one object with every check.
"""

from __future__ import annotations

import argparse
import sys

import orjson

from pipeline.commands._args import Subparsers, loaded_settings_from
from pipeline.core.settings import Settings, SettingsError

__all__ = ["register", "run"]

_MARK = {True: "ok  ", False: "FAIL", None: "-   "}


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "doctor",
        parents=[common],
        help="check brokers, credentials, topics, transactions, registry, log store, "
        "destinations; say what to fix",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object with every check")
    # Loads the settings itself: a settings error is one of its findings, also with --json.
    parser.set_defaults(run=run, own_settings=True)


def run(args: argparse.Namespace, _settings: Settings | None) -> int:
    from pipeline.ops.doctor import Check, diagnose

    def show(check: Check) -> None:
        if not args.json:
            print(f"{_MARK[check.ok]} {check.name:<16}{check.detail}", flush=True)
            if check.fix:
                print(f"     {'':<16}→ {check.fix}", flush=True)

    try:
        loaded = loaded_settings_from(args)
    except SettingsError as exc:
        failed = Check("settings", False, "; ".join(exc.problems), "fix the settings named")
        show(failed)
        if args.json:
            print(orjson.dumps({"ok": False, "checks": [failed.as_dict()]}).decode())
        return 2
    origins = loaded.origins.values()
    given = sum(1 for origin in origins if origin != "default")
    where = f", file {loaded.file}" if loaded.file else ""
    checks = [Check("settings", True, f"{given} set (environment, flags{where}); valid")]
    show(checks[0])
    checks += diagnose(loaded.settings, on_check=show)
    ok = all(check.ok is not False for check in checks)
    if args.json:
        body = {"ok": ok, "checks": [check.as_dict() for check in checks]}
        print(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        count = sum(1 for check in checks if check.ok is False)
        print(
            "all checks passed" if ok else f"{count} check(s) failed", file=sys.stderr, flush=True
        )
    return 0 if ok else 1
