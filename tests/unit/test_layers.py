"""The layers of ``pipeline/`` as a rule: a lower layer never imports a higher one, the core imports
nothing from Kafka or the network, and nothing but the client imports the client.

Every import statement counts, also the ones inside functions (a lazy import is still a dependency).

    core (0) < runtime (1) < store (2) < kafka (3) < ops (4) < http (5) < roles (6) < commands (7)

``client`` stands apart: it may import the core and (for its Kafka transport, lazily) the Kafka
shell; nothing of the pipeline imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"

LAYERS = {
    "core": 0,
    "runtime": 1,
    "store": 2,
    "kafka": 3,
    "ops": 4,
    "http": 5,
    "roles": 6,
    "commands": 7,
}
#: Third-party and standard modules that mean Kafka or the network.
KAFKA = {"confluent_kafka", "fastavro"}
NETWORK = {"aiohttp", "httpx", "socket", "ssl", "http", "urllib.request", "asyncio", "selectors"}
#: What each layer may not import from outside the package.
FORBIDDEN_EXTERNAL = {
    "core": KAFKA | NETWORK | {"prometheus_client"},
    "runtime": KAFKA | {"aiohttp", "httpx"},
    "store": KAFKA | {"aiohttp", "httpx"},
    "kafka": {"aiohttp", "httpx"},
}
#: What the client may import of the pipeline.
CLIENT_MAY_IMPORT = {"core", "kafka"}
#: The package's own top-level modules and the layer they count as.
TOP_LEVEL = {"__init__": "core", "__main__": "commands"}


def _layer_of(module: str) -> str | None:
    """``pipeline.kafka.codec`` → ``kafka``; ``pipeline`` → ``core`` (its ``__init__``)."""
    parts = module.split(".")
    if parts[0] != "pipeline":
        return None
    if len(parts) == 1:
        return TOP_LEVEL["__init__"]
    return parts[1] if parts[1] in LAYERS or parts[1] == "client" else TOP_LEVEL.get(parts[1])


def _imports(source: str, module: str) -> list[tuple[int, str]]:
    """Every module ``source`` imports, absolute, with its line number."""
    found = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # ``from pipeline import core`` imports the subpackage ``pipeline.core``
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def violations(modules: dict[str, str]) -> list[str]:
    """The broken rules in ``{module name: source}``, one line each."""
    problems = []
    for module, source in sorted(modules.items()):
        layer = _layer_of(module)
        if layer is None:
            continue
        reported: set[int] = set()  # one problem per import statement
        for line, target in _imports(source, module):
            problem = None if line in reported else _problem(layer, target)
            if problem is not None:
                problems.append(f"{module}:{line} imports {target}: {problem}")
                reported.add(line)
    return problems


def _problem(layer: str, target: str) -> str | None:
    """What is wrong with a module of ``layer`` importing ``target``, if anything."""
    target_layer = _layer_of(target)
    if target_layer is None:  # outside the package
        forbidden = FORBIDDEN_EXTERNAL.get(layer, set())
        if any(target == f or target.startswith(f + ".") for f in forbidden):
            return f"the {layer} layer may not use {target}"
        return None
    if target_layer == layer:
        return None
    if layer == "client":
        if target_layer not in CLIENT_MAY_IMPORT:
            return f"the client may import only {sorted(CLIENT_MAY_IMPORT)}"
        return None
    if target_layer == "client":
        return "only the client's users import the client"
    if LAYERS[target_layer] > LAYERS[layer]:
        return f"{layer} is below {target_layer}"
    return None


def _package_sources() -> dict[str, str]:
    sources = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        sources[".".join(parts)] = path.read_text()
    return sources


def test_the_package_keeps_its_layers():
    sources = _package_sources()
    assert len(sources) > 60  # the walk found the package
    assert violations(sources) == []


def test_every_subpackage_is_a_known_layer():
    found = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert found == set(LAYERS) | {"client"}
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == set(TOP_LEVEL)


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        ("pipeline.core.calls", "from pipeline.kafka.codec import Codec", "core is below kafka"),
        ("pipeline.core.calls", "import confluent_kafka", "may not use confluent_kafka"),
        ("pipeline.core.render", "def f():\n    import aiohttp\n", "may not use aiohttp"),
        ("pipeline.core.render", "from http import client", "may not use http"),
        ("pipeline.kafka.codec", "from ..http import sender", "kafka is below http"),
        ("pipeline.store.sqlite", "from pipeline.kafka.codec import Codec", "store is below kafka"),
        ("pipeline.store.sqlite", "import confluent_kafka", "may not use confluent_kafka"),
        ("pipeline.kafka.codec", "from pipeline import roles", "kafka is below roles"),
        ("pipeline.ops.dlq", "from pipeline.roles.worker import run_roles", "ops is below roles"),
        (
            "pipeline.http.sender",
            "from pipeline.commands.cli import main",
            "http is below commands",
        ),
        ("pipeline.roles.router", "from pipeline.client import Client", "import the client"),
        ("pipeline.client._http", "from pipeline.http.ingest import X", "client may import only"),
        ("pipeline.runtime.metrics", "import confluent_kafka", "may not use confluent_kafka"),
    ],
)
def test_a_violation_is_caught(module: str, source: str, broken: str):
    problems = violations({module: source})
    assert len(problems) == 1 and broken in problems[0], problems


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("pipeline.roles.router", "from pipeline.core.calls import Call"),
        ("pipeline.commands.cli", "from pipeline.roles.worker import run_roles"),
        ("pipeline.client._kafka", "from pipeline.kafka.producer import AsyncProducer"),
        ("pipeline.kafka.codec", "from .avro_writer import compile_writer"),
        ("pipeline.core.calls", "import orjson"),
    ],
)
def test_a_permitted_import_passes(module: str, source: str):
    assert violations({module: source}) == []
