"""The production deployment: docker-compose.yml, the image, Prometheus, Grafana and the Schema
Registry codec. Nothing here needs a Docker engine.

System tools (``prometheus``, ``promtool``, ``docker-compose``) come from Debian's packages through
``tests/setup_system.sh``, run on first need when they are missing. Where they cannot be installed
the tests fail, naming what is missing: they never skip.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import re
import shlex
import struct
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
import pytest
import yaml
from aiohttp import web

from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.settings import Settings
from pipeline.kafka.codec import MAGIC, Codec
from pipeline.runtime.net import free_port
from tests.support import ROOT, compose_command, require_system_tools

COMPOSE_FILE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "pipeline.json"
ROLES = ("ingest", "router", "deliver", "retry", "log-store")


# ---- system tools ------------------------------------------------------------------------------


def run_tool(*command: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done


# ---- the compose file --------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}`` with every variable unset (the defaults shipped)."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


@cache
def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    result: dict[str, Any] = interpolate(loaded)
    return result


@pytest.fixture
def compose() -> dict[str, Any]:
    return _compose()


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """{target: condition} in either of compose's two forms."""
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return {name: "service_started" for name in value}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in value.items()}


def pipeline_image(compose: dict[str, Any]) -> str:
    return str(services(compose)["router"]["image"])


def pipeline_commands(service: dict[str, Any]) -> list[list[str]]:
    """The ``pipeline`` argument lists a service runs (entrypoint ``pipeline`` or ``sh -c``)."""
    entrypoint = service.get("entrypoint")
    command = service.get("command") or []
    if isinstance(command, str):
        command = shlex.split(command)
    if entrypoint is None:  # the image's ENTRYPOINT ["pipeline"]
        return [list(map(str, command))]
    assert entrypoint == ["sh", "-c"], entrypoint
    script = " ".join(command)
    runs = []
    for part in re.split(r"&&|;|\|\|", script):
        words = shlex.split(part)
        assert words and words[0] == "pipeline", f"not a pipeline command: {part!r}"
        runs.append(words[1:])
    return runs


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def host_ports(spec: Any) -> list[int]:
    """Host ports of one ``ports:`` entry ("127.0.0.1:8080-8089:8080", "9090:9090", ...)."""
    text = str(spec) if not isinstance(spec, dict) else f"{spec.get('published', '')}:"
    parts = text.split(":")
    if len(parts) < 2 or not parts[-2]:
        return []
    published = parts[-2]
    if "-" in published:
        low, high = map(int, published.split("-"))
        return list(range(low, high + 1))
    return [int(published)]


def test_compose_file_validates_with_compose_itself():
    require_system_tools("compose")
    command = compose_command()
    assert command is not None
    done = run_tool(*command, "-f", str(COMPOSE_FILE), "config", "-q")
    assert done.stderr.strip() == "" or "WARN" not in done.stderr, done.stderr


def test_compose_services_images_healthchecks_and_restart_policies(compose):
    svc = services(compose)
    assert set(svc) == {
        "kafka",
        "schema-registry",
        "topic-init",
        *ROLES,
        "receiver",
        "prometheus",
        "grafana",
        "postgres",
        "jaeger",
    }
    assert svc["postgres"]["image"].startswith("postgres:")
    assert svc["jaeger"]["image"].startswith("jaegertracing/jaeger:")
    assert svc["kafka"]["image"].startswith("apache/kafka:")
    assert svc["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft
    assert svc["schema-registry"]["image"].startswith("confluentinc/cp-schema-registry:")
    assert svc["prometheus"]["image"].startswith("prom/prometheus:")
    assert svc["grafana"]["image"].startswith("grafana/grafana")
    for name, service in svc.items():
        assert service.get("image") or service.get("build"), f"{name}: no image and no build"
        if "build" in service:
            build = service["build"]
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
            assert service["image"] == pipeline_image(compose), name
        if name == "topic-init":  # a one-shot job
            assert service["restart"] == "no"
            continue
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name
        check = service.get("healthcheck")
        assert check and check.get("test"), f"{name}: no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        for key in ("interval", "timeout"):
            assert re.fullmatch(r"\d+[smh]", str(check[key])), (name, key)


def test_compose_dependencies_exist_are_acyclic_and_wait_for_health(compose):
    svc = services(compose)
    for name, service in svc.items():
        for target, condition in depends_on(service).items():
            assert target in svc, f"{name} depends on unknown {target}"
            assert condition in (
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            ), (name, condition)
            if condition == "service_healthy":
                assert svc[target].get("healthcheck"), f"{name} waits for {target}'s health"
            if condition == "service_completed_successfully":
                assert svc[target]["restart"] == "no", f"{target} must run once"
    # Topological order exists (no cycle), and it starts Kafka before the job and the job
    # before every role.
    order: list[str] = []
    pending = dict(svc)
    for _ in range(len(svc)):
        if not pending:
            break
        ready = [n for n, s in pending.items() if set(depends_on(s)) <= set(order)]
        assert ready, f"dependency cycle among {sorted(pending)}"
        order += sorted(ready)
        for n in ready:
            del pending[n]
    assert not pending
    assert depends_on(svc["topic-init"]) == {
        "kafka": "service_healthy",
        "schema-registry": "service_healthy",
    }
    for role in ROLES:
        assert depends_on(svc[role])["topic-init"] == "service_completed_successfully", role
        assert depends_on(svc[role])["kafka"] == "service_healthy", role


def test_compose_ports_are_unique_and_roles_scale(compose):
    svc = services(compose)
    seen: dict[int, str] = {}
    for name, service in svc.items():
        for spec in service.get("ports", []):
            for port in host_ports(spec):
                assert port not in seen, f"host port {port}: {seen[port]} and {name}"
                seen[port] = name
    for role in ROLES:
        service = svc[role]
        # `docker compose up --scale ROLE=N` needs no fixed name, no fixed address, no fixed
        # host port (ingest publishes a range, one port per replica).
        assert "container_name" not in service, role
        assert not any(
            isinstance(net, dict) and "ipv4_address" in net
            for net in (service.get("networks") or {}).values()
            if net
        ), role
        for spec in service.get("ports", []):
            assert len(host_ports(spec)) > 1, f"{role}: a fixed host port prevents scaling"


def test_compose_runs_real_pipeline_commands(compose):
    from pipeline.commands.cli import build_parser

    parser = build_parser()
    svc = services(compose)
    image = pipeline_image(compose)
    seen: dict[str, list[str]] = {}
    for name, service in svc.items():
        if service.get("image") != image:
            continue
        for args in pipeline_commands(service):
            try:
                parsed = parser.parse_args(args)
            except SystemExit:
                pytest.fail(f"{name}: `pipeline {' '.join(args)}` is not a valid pipeline command")
            seen[f"{name}:{parsed.command}"] = args
    for role in ROLES:
        assert f"{role}:{role}" in seen, f"the {role} service does not run `pipeline {role}`"
    assert "topic-init:topics" in seen and "topic-init:config" in seen
    assert "receiver:receiver" in seen
    # Workers serve /metrics where their healthcheck and Prometheus look.
    for role in ("router", "deliver", "retry", "log-store"):
        assert option(seen[f"{role}:{role}"], "--metrics-port") == "9100", role
        assert "9100" in " ".join(svc[role]["healthcheck"]["test"]), role
    for name in ("ingest", "receiver"):
        assert option(seen[f"{name}:{name}"], "--host") == "0.0.0.0", name


def test_compose_environment_wires_kafka_registry_and_the_receiver_allowlist(compose):
    svc = services(compose)
    for name, service in svc.items():
        if service.get("image") != pipeline_image(compose) or name == "receiver":
            continue
        env = service["environment"]
        host, port = env["PIPELINE_BOOTSTRAP_SERVERS"].split(":")
        assert (
            host == "kafka"
            and f"PLAINTEXT://{host}:{port}"
            in (svc["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"])
        ), name
        registry = urllib.parse.urlsplit(env["PIPELINE_SCHEMA_REGISTRY_URL"])
        assert registry.hostname == "schema-registry", name
        assert (
            str(registry.port) in svc["schema-registry"]["environment"]["SCHEMA_REGISTRY_LISTENERS"]
        ), name
        Settings.from_env({k: str(v) for k, v in env.items()})  # every value parses
        # Every role exports its traces to Jaeger (OTLP over HTTP), and the OTEL_* parse.
        otlp = urllib.parse.urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert (otlp.hostname, otlp.port) == ("jaeger", 4318), name
        from pipeline.runtime import tracing

        try:
            assert tracing.configure(name, {k: str(v) for k, v in interpolate(env).items()})
        finally:
            tracing.configure(name, {})
    # Deliveries may reach the demo receiver's address (the SSRF guard blocks private ones).
    subnet = ipaddress.ip_network(compose["networks"]["default"]["ipam"]["config"][0]["subnet"])
    receiver_ip = ipaddress.ip_address(svc["receiver"]["networks"]["default"]["ipv4_address"])
    assert receiver_ip in subnet
    for role in ("deliver", "retry"):
        allowed = [
            ipaddress.ip_network(n.strip())
            for n in svc[role]["environment"]["PIPELINE_ALLOWED_NETWORKS"].split(",")
        ]
        assert any(receiver_ip in net for net in allowed), role
        assert all(net.subnet_of(subnet) for net in allowed), f"{role}: allows more than compose"


def test_compose_mounts_shipped_files_and_the_demo_config_is_valid(compose):
    from pipeline.core.config import validate_config

    svc = services(compose)
    mounts: dict[str, dict[str, Path]] = {}
    for name, service in svc.items():
        for volume in service.get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
                mounts.setdefault(name, {})[target] = ROOT / source
    # topic-init applies a config file that is mounted, valid, and points at the demo receiver.
    config_args = next(a for a in pipeline_commands(svc["topic-init"]) if a[0] == "config")
    container_path = Path(config_args[-1])
    local = mounts["topic-init"][str(container_path.parent)] / container_path.name
    config = validate_config(yaml.safe_load(local.read_text()))
    receiver_args = pipeline_commands(svc["receiver"])[0]
    for destination in config.destinations:
        for webhook in destination.webhooks:
            url = urllib.parse.urlsplit(webhook.url)
            assert url.hostname == "receiver", webhook.url
            assert str(url.port) == option(receiver_args, "--port"), webhook.url
        assert destination.shared_secret == option(receiver_args, "--secret")
    # Prometheus and Grafana get the shipped files.
    assert mounts["prometheus"]["/etc/prometheus"] == PROMETHEUS_DIR
    grafana = mounts["grafana"]
    assert grafana["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "pipeline.yml").read_text()
    )["providers"][0]
    assert grafana[provider["options"]["path"]] == DASHBOARD.parent
    home = svc["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def test_dockerfile_is_slim_non_root_and_installs_the_project():
    text = (DEPLOY / "Dockerfile").read_text()
    instructions = [
        line.split(None, 1)
        for line in text.splitlines()
        if line and not line.startswith(("#", " "))
    ]
    keywords = [i[0] for i in instructions]
    assert instructions[0] == ["FROM", "python:3.11-slim"]
    user = [i[1] for i in instructions if i[0] == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0"), user
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")
    # The project itself, with the PostgreSQL driver of the log store.
    assert re.search(r"pip install \"\.\[postgres\]\"(\s|$)", text)
    assert ["ENTRYPOINT", '["pipeline"]'] in instructions
    copied = {i[1].split()[0] for i in instructions if i[0] == "COPY"}
    assert {"schemas", "pipeline"} <= copied
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for path in ("pyproject.toml", "README.md"):
        assert f"!{path}" in ignore
    for directory in ("schemas", "pipeline"):
        assert f"!{directory}" in ignore


# ---- Prometheus: the shipped config and alert rules --------------------------------------------


def test_promtool_checks_the_shipped_config_and_rules():
    require_system_tools("promtool")
    run_tool("promtool", "check", "config", str(PROMETHEUS_DIR / "prometheus.yml"))
    run_tool("promtool", "check", "rules", str(PROMETHEUS_DIR / "alerts.yml"))
    # The alert rules' own unit tests (series in, alerts out).
    run_tool("promtool", "test", "rules", "alerts_test.yml", cwd=PROMETHEUS_DIR)


def test_prometheus_scrapes_every_role_where_compose_serves_it(compose):
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    svc = services(compose)
    for role in ROLES:
        (discovery,) = jobs[role]["dns_sd_configs"]  # every replica of a scaled service
        assert discovery["names"] == [role]
        args = pipeline_commands(svc[role])[0]
        port = option(args, "--metrics-port") or option(args, "--port")
        assert str(discovery["port"]) == port, role
    assert config["rule_files"] == ["alerts.yml"]


@cache
def exported_metric_names() -> frozenset[str]:
    """Every sample name the code can export: counters end in _total (and _created), histograms
    in _bucket, _sum, _count."""
    from prometheus_client import REGISTRY

    import pipeline.runtime.metrics  # noqa: F401  (registers the metrics)

    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
        "summary": ("_sum", "_count", "_created", ""),
    }
    result: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith("pipeline_"):
            result.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return frozenset(result)


_METRIC = re.compile(r"\b(pipeline_[a-z0-9_]+)\b")
#: Prometheus' own series the queries may use besides ours.
_PROMETHEUS_SERIES = {"up"}


def metric_names_in(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def test_alert_rules_cover_the_issue_and_name_exported_metrics():
    rules = [
        rule
        for group in yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    ]
    alerts = {rule["alert"]: rule for rule in rules}
    assert {
        "PipelineDeadLettersGrowing",  # DLQ growth
        "PipelineConsumerLagHigh",  # consumer lag
        "PipelineDeliverySuccessRatioLow",  # delivery success ratio
        "PipelineRetryTierBacklog",  # retry-tier depth
    } <= set(alerts)
    exported = exported_metric_names()
    for name, rule in alerts.items():
        used = metric_names_in(rule["expr"])
        assert used <= exported, f"{name}: not exported: {used - exported}"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    readme = (ROOT / "README.md").read_text()
    documented = readme[readme.index("## Production") :]
    for name in alerts:
        assert name in documented, f"README.md's Production section does not explain {name}"


# ---- Grafana: the dashboard --------------------------------------------------------------------


def dashboard_targets() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel, target)
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def test_dashboard_parses_and_every_query_names_an_exported_metric():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    datasource = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    exported = exported_metric_names()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{panel['title']}: no query"
        assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
        for target in panel["targets"]:
            used = metric_names_in(target["expr"])
            assert used or set(re.findall(r"\b\w+\b", target["expr"])) & _PROMETHEUS_SERIES, (
                f"{panel['title']}: the query names no metric"
            )
            assert used <= exported, f"{panel['title']}: not exported: {used - exported}"
    rows = {p["title"] for p in panels if p["type"] == "row"}
    assert {
        "Throughput",
        "Outcomes",
        "Latency",
        "Lag and load",
        "Retries",
        "Dead letters",
        "Per destination",
    } <= rows
    # The destination variable lists the label's values; the per-destination panels filter on it.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    destination = variables["destination"]
    assert destination["multi"] and destination["includeAll"]
    assert destination["query"] == "label_values(pipeline_deliveries_total, destination)"
    assert '{destination=~"$destination"}' in "".join(
        t["expr"] for p, t in dashboard_targets() if p["title"] == "Open circuits by destination"
    )
    exprs = " ".join(t["expr"] for _, t in dashboard_targets())
    for histogram in ("pipeline_delivery_attempt_seconds", "pipeline_end_to_end_seconds"):
        for quantile in ("0.5", "0.95", "0.99"):
            assert f"histogram_quantile({quantile}, sum by (le) (rate({histogram}_bucket" in exprs
    for metric in (
        "pipeline_calls_ingested_total",
        "pipeline_deliveries_total",
        "pipeline_consumer_lag",
        "pipeline_retries_total",
        "pipeline_dead_letters_total",
        "pipeline_circuits_open",
    ):
        assert metric in exprs, metric


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each panel query (as a recording rule; Grafana's $__rate_interval → 1m)."""
    require_system_tools("promtool")
    rules = [
        {
            "record": f"dashboard:panel_{panel['id']}_{target['refId'].lower()}",
            "expr": target["expr"].replace("$__rate_interval", "1m"),
        }
        for panel, target in dashboard_targets()
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_tool("promtool", "check", "rules", str(path))


def test_grafana_provisioning_files_parse():
    datasources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    assert urllib.parse.urlsplit(source["url"]).hostname == "prometheus"
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "pipeline.yml").read_text()
    )["providers"]
    assert [p["type"] for p in providers] == ["file"]


# ---- Schema Registry codec ---------------------------------------------------------------------


class FakeSchemaRegistry:
    """The few Schema Registry REST endpoints confluent_kafka's client uses, on 127.0.0.1:

    ``POST /subjects/{subject}/versions`` → ``{"id": n}`` (the same schema text keeps its id),
    ``GET /schemas/ids/{id}`` → ``{"schema": text}`` or 404 ``{"error_code": 40403}``.
    ``refuse`` makes registration answer 409 (incompatible schema).
    """

    def __init__(self) -> None:
        self.schemas: list[str] = []
        self.subjects: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str]] = []
        self.refuse = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    def register(self, subject: str, text: str) -> int:
        if text not in self.schemas:
            self.schemas.append(text)
        schema_id = self.schemas.index(text) + 1
        self.subjects.setdefault(subject, []).append(schema_id)
        return schema_id

    async def _register(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path))
        if self.refuse:
            return web.json_response(
                {"error_code": 409, "message": "Schema being registered is incompatible"},
                status=409,
            )
        body = await request.json()
        schema_id = self.register(request.match_info["subject"], body["schema"])
        return web.json_response({"id": schema_id})

    async def _schema(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path))
        schema_id = int(request.match_info["id"])
        if not 1 <= schema_id <= len(self.schemas):
            return web.json_response(
                {"error_code": 40403, "message": f"Schema {schema_id} not found"}, status=404
            )
        return web.json_response({"schema": self.schemas[schema_id - 1]})

    def start(self) -> FakeSchemaRegistry:
        self.thread.start()

        async def serve() -> str:
            app = web.Application()
            app.router.add_post("/subjects/{subject}/versions", self._register)
            app.router.add_get("/schemas/ids/{id}", self._schema)
            self.runner = web.AppRunner(app, access_log=None)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

        self.url = asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)
        return self

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def registry() -> Iterator[FakeSchemaRegistry]:
    fake = FakeSchemaRegistry().start()
    yield fake
    fake.stop()


def sample_record(schema: Any, named: dict[str, Any] | None = None, namespace: str = "") -> Any:
    """A valid value for ``schema`` (JSON form, self-contained): every field set, unions to their
    last branch, so nothing relies on defaults."""
    named = {} if named is None else named
    if isinstance(schema, list):
        return sample_record(schema[-1], named, namespace)
    if isinstance(schema, str):
        primitive = {
            "null": None,
            "boolean": True,
            "int": 7,
            "long": 1_790_000_000_000,
            "float": 1.5,
            "double": 2.5,
            "bytes": b"\x00body\xff",
            "string": "text ✓",
        }
        if schema in primitive:
            return primitive[schema]
        full = schema if "." in schema else f"{namespace}.{schema}".lstrip(".")
        return sample_record(named.get(full, named.get(schema)), named, namespace)
    kind = schema["type"]
    if kind in ("record", "error", "enum", "fixed"):
        name = schema["name"]
        own = schema.get("namespace", namespace)
        full = name if "." in name else f"{own}.{name}".lstrip(".")
        named[full] = schema
        namespace = full.rsplit(".", 1)[0] if "." in full else ""
        if kind == "enum":
            return schema["symbols"][-1]
        if kind == "fixed":
            return b"\x01" * schema["size"]
        return {f["name"]: sample_record(f["type"], named, namespace) for f in schema["fields"]}
    if kind == "array":
        return [sample_record(schema["items"], named, namespace)]
    if kind == "map":
        return {"key": sample_record(schema["values"], named, namespace)}
    return sample_record(kind, named, namespace)


def test_without_a_registry_url_records_use_single_object_encoding():
    from pipeline.kafka.registry_codec import make_codec

    codec = make_codec(Settings())
    assert codec is Codec.default()
    record = {
        "id": "web",
        "name": "Web",
        "writeKeys": ["k"],
        "blockedEvents": [],
        "changedBy": "apply",
        "changedAt": 1,
    }
    data = codec.encode("Source", record)
    assert data[:2] == MAGIC
    assert codec.decode("Source", data) == record


def test_registry_schemas_are_self_contained_and_identical_to_ours():
    from pipeline.kafka.registry_codec import registry_schemas

    codec = Codec.default()
    texts = registry_schemas()
    assert "Delivery" in texts and "DeadLetter" in texts
    for name, text in texts.items():
        parsed = fastavro.parse_schema(json.loads(text))  # needs no named types from elsewhere
        ours = fastavro.schema.expand_schema(codec.schema(name))
        assert canonical(parsed) == canonical(ours), name


def canonical(parsed: Any) -> str:
    return str(fastavro.schema.to_parsing_canonical_form(parsed))


def test_registry_codec_round_trips_every_schema_in_the_confluent_wire_format(registry):
    from pipeline.kafka.registry_codec import RegistryCodec, make_codec, registry_schemas

    codec = make_codec(Settings(schema_registry_url=registry.url))
    assert isinstance(codec, RegistryCodec)
    with codec, RegistryCodec(registry.url) as reader:
        check_round_trips(registry, codec, reader, registry_schemas())


def check_round_trips(
    registry: FakeSchemaRegistry, codec: Any, reader: Any, texts: dict[str, str]
) -> None:
    encoded: dict[str, bytes] = {}
    for name, text in texts.items():
        record = sample_record(json.loads(text))
        data = codec.encode(name, record)
        encoded[name] = data
        # 00, the 4-byte big-endian id the registry gave the subject, then the Avro body.
        assert data[0] == 0
        (schema_id,) = struct.unpack(">I", data[1:5])
        subject = codec.subject(name)
        raw = json.loads(text)
        assert subject == f"{raw['namespace']}.{raw['name']}"  # record name strategy
        assert registry.subjects[subject][-1] == schema_id
        assert data[5:] == fastavro_body(json.loads(text), record)
        assert codec.decode(name, data) == record
        assert codec.encode(name, record) == data  # registered once, then cached
    assert len(registry.subjects) == len(texts)
    assert all(len(ids) == 1 for ids in registry.subjects.values()), registry.subjects

    # Another process (a fresh client) reads them: one GET per schema id, then from its cache.
    registry.requests.clear()
    for _ in range(2):
        for name, data in encoded.items():
            assert reader.decode(name, data) == codec.decode(name, data)
    gets = [path for method, path in registry.requests if method == "GET"]
    assert sorted(gets) == sorted(
        {f"/schemas/ids/{int.from_bytes(d[1:5], 'big')}" for d in encoded.values()}
    )


def fastavro_body(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def test_registry_codec_resolves_an_older_writer_schema_and_reads_single_object_records(registry):
    from pipeline.kafka.registry_codec import RegistryCodec

    with RegistryCodec(registry.url) as codec:
        check_resolution(registry, codec)


def check_resolution(registry: FakeSchemaRegistry, codec: Any) -> None:
    # A record written before Source had blockedEvents: the reader fills in the default.
    old = {
        "type": "record",
        "name": "Source",
        "namespace": "pipeline.config",
        "fields": [{"name": "id", "type": "string"}, {"name": "name", "type": "string"}],
    }
    old_id = registry.register("pipeline.config.Source", json.dumps(old))
    data = b"\x00" + struct.pack(">I", old_id) + fastavro_body(old, {"id": "web", "name": "Web"})
    assert codec.decode("Source", data) == {
        "id": "web",
        "name": "Web",
        "writeKeys": [],
        "blockedEvents": [],
        "changedBy": None,
        "changedAt": None,
    }
    # Records already on the topics in single-object encoding still decode after the switch.
    record = {
        "id": "app",
        "name": "App",
        "writeKeys": ["k"],
        "blockedEvents": ["Debug"],
        "changedBy": "console:ab12",
        "changedAt": 2,
    }
    assert codec.decode("Source", Codec.default().encode("Source", record)) == record


def test_registry_codec_errors_tell_bad_records_from_an_unavailable_registry(registry):
    from pipeline.kafka.registry_codec import RegistryCodec, SchemaRegistryUnavailable

    with RegistryCodec(registry.url) as codec:
        good = codec.encode("Source", SOURCE)
        check_bad_bytes(codec, good)
    # A registry that refuses a schema, or cannot be reached, is not the record's fault.
    registry.refuse = True
    with (
        RegistryCodec(registry.url) as refused,
        pytest.raises(SchemaRegistryUnavailable, match="refused"),
    ):
        refused.encode("Call", {**SOURCE})
    nowhere = f"http://127.0.0.1:{free_port()}"
    with RegistryCodec(nowhere, conf={"max.retries": 0, "timeout": 2}) as offline:
        with pytest.raises(SchemaRegistryUnavailable, match="unreachable"):
            offline.encode("Source", SOURCE)
        with pytest.raises(SchemaRegistryUnavailable):
            offline.decode("Source", good)
    assert not issubclass(SchemaRegistryUnavailable, UndecodableRecord)


SOURCE = {"id": "w", "name": "W", "writeKeys": [], "blockedEvents": []}


def check_bad_bytes(codec: Any, good: bytes) -> None:
    # Bad bytes are undecodable (a dead letter), never a crash.
    for data in (None, b"", b"\x00\x00\x00", b"\x07junkjunk", good[:-3] + b"\xff\xff\xff"):
        with pytest.raises(UndecodableRecord):
            codec.decode("Source", data)
    unknown = b"\x00" + struct.pack(">I", 9999) + good[5:]
    with pytest.raises(UndecodableRecord, match="9999"):
        codec.decode("Source", unknown)
