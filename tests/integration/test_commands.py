"""The command modules' own wiring, through the real ``pipeline`` command."""

from __future__ import annotations

import httpx

from pipeline.commands.cli import COMMANDS, build_parser
from pipeline.runtime.net import free_port
from tests.support import apply, ingest_config, wait_until_ready


def test_ingest_ack_timeout_keeps_the_admin_token(settings, process_factory):
    """``--ack-timeout`` changes the timeout and nothing else the environment set: the admin
    endpoints stay on with PIPELINE_ADMIN_TOKEN (they were silently turned off)."""
    apply(settings, ingest_config())
    port = free_port()
    process_factory(
        settings,
        "ingest",
        "--port",
        str(port),
        "--ack-timeout",
        "5s",
        env={"PIPELINE_ADMIN_TOKEN": "t0ken"},
    )
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url)
    anonymous = httpx.get(url + "/admin/delete-user/nobody", timeout=10)
    assert anonymous.status_code == 401, anonymous.text
    authorised = httpx.get(
        url + "/admin/delete-user/nobody", headers={"Authorization": "Bearer t0ken"}, timeout=10
    )
    assert (authorised.status_code, authorised.json()["code"]) == (404, "not_found")


def test_every_command_module_registers_and_dispatches():
    """Each command module adds its commands, and each parsed command runs its module's ``run``."""
    parser = build_parser()
    runs = {command.run for command in COMMANDS}
    samples = [
        ["dev"],
        ["broker"],
        ["topics", "create"],
        ["config", "show"],
        ["worker"],
        ["router"],
        ["send", "-"],
        ["dlq", "list"],
        ["delete-user", "u1"],
        ["audience", "sync", "--source", "s", "--name", "n", "--members", "-"],
        ["traits", "sync", "--source", "s", "--name", "n", "--values", "-"],
        ["ingest"],
        ["receiver"],
        ["trace", "m1"],
        ["log"],
        ["stats"],
        ["log-store"],
        ["console"],
        ["replay", "--destination", "d", "--since", "1h"],
        ["settings"],
        ["doctor"],
    ]
    seen = set()
    for argv in samples:
        args = parser.parse_args(argv)
        assert args.run in runs, argv
        seen.add(args.run)
    assert seen == runs
