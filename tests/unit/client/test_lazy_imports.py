"""``import pipeline.client`` and the HTTP transport load no Kafka, Avro or Prometheus code."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT

HEAVY = ("confluent_kafka", "fastavro", "prometheus_client")


def run(script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_http_client_imports_neither_kafka_nor_avro_nor_prometheus() -> None:
    loaded = run(
        "import sys\n"
        "import pipeline.client\n"
        "from pipeline.client import AsyncClient, Client\n"
        "client = Client('wk', endpoint='http://127.0.0.1:9', flush_after=60)\n"
        "client.track('u1', 'Lazy')\n"
        "client.close(timeout=0.1)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert loaded == "[]"


def test_metrics_join_prometheus_once_it_is_imported_and_keep_earlier_counts() -> None:
    exported = run(
        "import sys\n"
        "from pipeline.client import Client\n"
        "client = Client('wk', endpoint='http://127.0.0.1:9', flush_after=60, max_queue_size=1)\n"
        "client.track('u1', 'Queued')\n"
        "client.track('u1', 'Dropped')  # counted before Prometheus is in the process\n"
        "assert 'prometheus_client' not in sys.modules\n"
        "from prometheus_client import REGISTRY\n"
        "Client('wk', endpoint='http://127.0.0.1:9')  # the next client registers the collector\n"
        "print(REGISTRY.get_sample_value('pipeline_client_dropped_calls_total',"
        " {'reason': 'queue_full'}), REGISTRY.get_sample_value('pipeline_client_queue_depth'))\n"
    )
    assert exported == "1.0 1.0"


def test_a_kafka_client_loads_the_kafka_transport() -> None:
    loaded = run(
        "import sys\n"
        "from pipeline.client import Client\n"
        "client = Client('', bootstrap_servers='127.0.0.1:9', source_id='web')\n"
        "print('confluent_kafka' in sys.modules)\n"
        "client.close(timeout=0.1)\n"
    )
    assert loaded == "True"
