"""The public surface of the package ``pipeline``."""

from __future__ import annotations

import pipeline

EXPECTED = {
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
}


def test_all_is_exactly_the_public_set() -> None:
    assert set(pipeline.__all__) == EXPECTED
    assert len(pipeline.__all__) == len(EXPECTED)  # no duplicates


def test_every_public_name_exists() -> None:
    for name in pipeline.__all__:
        assert hasattr(pipeline, name), name


def test_star_import_gives_the_public_set() -> None:
    namespace: dict[str, object] = {}
    exec("from pipeline import *", namespace)  # noqa: S102
    assert set(namespace) - {"__builtins__"} == EXPECTED


def test_version() -> None:
    assert pipeline.__version__ == "0.1.0"


def test_exception_hierarchy() -> None:
    for name in (
        "InvalidCall",
        "ConfigError",
        "BrokerUnavailable",
        "UndecodableRecord",
    ):
        assert issubclass(getattr(pipeline, name), pipeline.PipelineError)
    assert issubclass(pipeline.CallTooLarge, pipeline.InvalidCall)
    assert issubclass(pipeline.PipelineError, Exception)


def test_an_unknown_write_key_is_never_echoed_whole() -> None:
    from pipeline.core.config import shown_write_key

    assert "0123456789abcdef" not in shown_write_key("wk_live_0123456789abcdef")
    assert shown_write_key("short") == "short"
