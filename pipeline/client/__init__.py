"""The Python client library: queue analytics calls, deliver them in batches in the background.

    from pipeline.client import Client

    client = Client("wk_live_1", endpoint="http://127.0.0.1:8080")   # pipeline ingest
    client.identify(user_id="u1", traits={"plan": "pro"})
    client.track(user_id="u1", event="Order Completed", properties={"revenue": "42.50"})
    client.flush(timeout=5)        # True once every call is delivered
    client.close()                 # also done at interpreter exit

Transports: HTTP to the ingestion API (default; ``POST /v1/batch``, Basic auth, gzip), or Kafka
directly: ``Client("", bootstrap_servers="kafka:9092", source_id="web")``. The Kafka transport
writes the same Avro records as the API; it resolves no write key, so it needs the id of the
source its calls belong to (``source_id``), and ``topic_prefix`` if the pipeline uses one.

``AsyncClient`` is the same for asyncio applications (``await client.flush()``).
``DEBUG=analytics`` in the environment logs what the client does (logger ``pipeline.client``).
"""

from __future__ import annotations

from ._async import AsyncClient
from ._backoff import Backoff
from ._client import Client, OnError
from ._errors import (
    CallTooLarge,
    ClientClosed,
    ClientError,
    DeliveryError,
    InvalidCall,
    QueueFull,
)
from ._options import DEFAULT_ENDPOINT

__all__ = [
    "DEFAULT_ENDPOINT",
    "AsyncClient",
    "Backoff",
    "CallTooLarge",
    "Client",
    "ClientClosed",
    "ClientError",
    "DeliveryError",
    "InvalidCall",
    "OnError",
    "QueueFull",
]
