"""Analytics calls on Kafka, delivered as signed webhooks.

The public API: the call model, body rendering and signing for receivers, settings, and errors.
The client library lives in ``pipeline.client``. Everything in a ``_module`` may move.
"""

from __future__ import annotations

from pipeline.core.calls import MAX_BATCH_BYTES, MAX_CALL_BYTES, Call, CallType, parse_call
from pipeline.core.exceptions import (
    BrokerUnavailable,
    CallTooLarge,
    ConfigError,
    InvalidCall,
    PipelineError,
    UndecodableRecord,
)
from pipeline.core.render import render_body
from pipeline.core.settings import Settings
from pipeline.core.signing import sign, verify

__version__ = "0.1.0"

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_CALL_BYTES",
    "BrokerUnavailable",
    "Call",
    "CallTooLarge",
    "CallType",
    "ConfigError",
    "InvalidCall",
    "PipelineError",
    "Settings",
    "UndecodableRecord",
    "__version__",
    "parse_call",
    "render_body",
    "sign",
    "verify",
]
