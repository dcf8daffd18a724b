"""``pipeline doctor`` against a healthy and a broken setup, through the real command."""

from __future__ import annotations

import time

import orjson

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topic_specs
from pipeline.runtime.net import free_port
from tests.support import apply, run_cli, simple_config


def test_a_healthy_setup_passes_every_check(settings, receiver_factory):
    apply(settings, simple_config(receiver_factory().url))
    done = run_cli(settings, "doctor", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[1]: line for line in done.stdout.splitlines() if line[:4].strip()}
    for check in ("settings", "brokers", "topics", "transactions", "log", "destinations"):
        assert lines[check].startswith("ok"), lines[check]
    assert "(the embedded broker)" in lines["brokers"]
    assert "1 webhook URL(s) of 1 destination(s)" in lines["destinations"]
    assert lines["schema"].startswith("-")  # not used: no registry configured
    assert "all checks passed" in done.stderr


def test_a_broken_setup_names_each_problem_and_what_to_do(settings):
    # A destination the SSRF guard refuses, and a topic prefix with no topics yet.
    apply(
        settings.replace(allowed_networks=()),
        simple_config("http://10.1.2.3/hook"),
    )
    guarded = settings.replace(allowed_networks=())
    done = run_cli(guarded, "doctor", "--json", timeout=60)
    assert done.returncode == 1
    report = orjson.loads(done.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    assert report["ok"] is False
    assert checks["brokers"]["ok"] is True
    assert checks["destinations"]["ok"] is False
    assert (
        "hooks: 10.1.2.3: 10.1.2.3 is in a blocked range (private)"
        in (checks["destinations"]["detail"])
    )
    assert "PIPELINE_ALLOWED_NETWORKS" in checks["destinations"]["fix"]

    fresh = settings.replace(topic_prefix=settings.topic_prefix + "none.")
    missing = run_cli(fresh, "doctor", timeout=60)
    assert missing.returncode == 1
    every = len(topic_specs(fresh))  # 15 with 2 retry tiers
    assert f"FAIL topics          {every} missing" in missing.stdout, missing.stdout
    assert "→ run `pipeline topics create`" in missing.stdout


def test_an_unreachable_broker_is_one_failed_check_within_seconds(tmp_path):
    nowhere = Settings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        log_store_url=f"sqlite:///{tmp_path / 'log.sqlite3'}",
    )
    started = time.monotonic()
    done = run_cli(nowhere, "doctor", timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 1
    assert "FAIL brokers         no Kafka broker answered at" in done.stdout
    assert "Connection refused" in done.stdout
    assert "skipped: the cluster was not reached" in done.stdout
    assert "ok   log store" in done.stdout  # the checks that need no cluster still run
    assert took < 20
    assert " ERROR " not in done.stderr  # its findings, not librdkafka's log lines
