"""What a spec may not reach for (issue #51): the deployment's brokers, security settings and credentials,
code loaded into the process; the deployment's registry credentials go to the deployment's registry only."""
import base64
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ledgerbatch.errors import SpecError
from ledgerbatch.source.client_settings import SPEC_SETTINGS
from ledgerbatch.source.kafka import consumer_config
from ledgerbatch.spec.pipeline import parse_spec, with_kafka_options
from ledgerbatch.spec.resolve import registry_settings, with_registry

DEPLOYMENT_KAFKA = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "etl",
                    "sasl.password": "Kafka-S3cret"}
DEPLOYMENT_REGISTRY = {"url": "https://registry.internal:8081", "basic.auth.user.info": "etl:Registry-S3cret"}


def spec(kafka=None, registry=None, fmt="json"):
    source = {"topics": ["orders"], "format": fmt, "schema": "order_id STRING"}
    if kafka is not None:
        source["kafka"] = kafka
    if registry is not None:
        source["schema_registry"] = registry
    return parse_spec({"name": "orders", "source": source, "target": {"table": "public.orders"}})


@pytest.mark.parametrize("key, why", [
    ("bootstrap.servers", "the brokers are the deployment's"),
    ("metadata.broker.list", "the brokers are the deployment's"),
    ("security.protocol", "security settings and their credentials are the deployment's"),
    ("sasl.mechanism", "security settings"),
    ("sasl.password", "security settings"),
    ("ssl.ca.location", "security settings"),
    ("ssl.endpoint.identification.algorithm", "security settings"),
    ("enable.ssl.certificate.verification", "security settings"),
    ("https.ca.location", "security settings"),
    ("plugin.library.paths", "it loads code or runs a command"),
    ("sasl.kerberos.kinit.cmd", "it loads code or runs a command"),
    ("isolation.level", "ledgerbatch sets it itself"),
    ("group.id", "ledgerbatch sets it itself"),
    ("debug", "a spec may set only these fetch settings: api.version.request.timeout.ms"),
])
def test_source_kafka_refuses_what_a_spec_does_not_own(key, why):
    with pytest.raises(SpecError, match=rf"source\.kafka: '{key}' cannot be set in a spec: {why}"):
        spec(kafka={key: "x"})


def test_fetch_settings_pass_and_never_displace_the_deployment():
    own = {"client.id": "orders-etl", "fetch.max.bytes": 1048576, "queued.max.messages.kbytes": "65536"}
    merged = with_kafka_options(spec(kafka=own), DEPLOYMENT_KAFKA)
    conf = consumer_config("kafka.internal:9093", dict(merged.kafka_options))
    assert conf["bootstrap.servers"] == "kafka.internal:9093" and conf["fetch.max.bytes"] == "1048576"
    assert {k: conf[k] for k in DEPLOYMENT_KAFKA} == DEPLOYMENT_KAFKA


def test_every_allowed_setting_is_a_librdkafka_consumer_setting():
    from confluent_kafka import Consumer

    # librdkafka refuses unknown names when the client is built (no broker is contacted before poll)
    Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **{k: _valid(k) for k in SPEC_SETTINGS}}).close()


def _valid(key: str) -> str:
    special = {"broker.address.family": "v4", "client.id": "x", "client.rack": "r1", "check.crcs": "true",
               "socket.keepalive.enable": "true", "socket.nagle.disable": "false", "fetch.min.bytes": "1",
               "socket.receive.buffer.bytes": "0", "connections.max.idle.ms": "0",
               "receive.message.max.bytes": "100000000"}
    return special.get(key, "10000" if key.endswith(".ms") else "1048576")


def test_registry_credentials_go_only_to_the_deployments_registry():
    elsewhere = {"url": "http://127.0.0.1:9/", "timeout": "5"}
    assert registry_settings(elsewhere, DEPLOYMENT_REGISTRY) == elsewhere  # a registry of its own: its settings
    assert registry_settings({"url": "https://registry.internal:8081,http://evil:8081"},
                             DEPLOYMENT_REGISTRY)["url"].endswith("evil:8081")
    assert "basic.auth.user.info" not in registry_settings({"url": "https://registry.internal:8081,http://evil"},
                                                           DEPLOYMENT_REGISTRY)
    # the deployment's registry (named or not): the deployment's settings, over the spec's
    for own in ({}, {"url": "https://registry.internal:8081/"}, {"basic.auth.user.info": "me:mine", "timeout": "5"}):
        got = registry_settings(own, DEPLOYMENT_REGISTRY)
        assert {k: got[k] for k in DEPLOYMENT_REGISTRY} == DEPLOYMENT_REGISTRY
    assert registry_settings({"timeout": "5"}, DEPLOYMENT_REGISTRY)["timeout"] == "5"


def test_a_spec_naming_its_own_registry_is_sent_no_deployment_credentials():
    """Over the wire: loading a schemaless Avro spec asks its registry for the subject's latest schema."""
    seen = []

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error_code": 40401, "message": "Subject not found"}')

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        doc = {"name": "payments", "source": {"topics": ["payments"], "format": "avro",
                                              "schema_registry": {"url": f"http://127.0.0.1:{server.server_port}"}},
               "target": {"table": "public.payments"}}
        with pytest.raises(SpecError, match="no subject payments-value"):
            with_registry(parse_spec(doc), DEPLOYMENT_REGISTRY)
    finally:
        server.shutdown()
        server.server_close()
    assert seen and all(auth is None for auth in seen)
    secret = base64.b64encode(DEPLOYMENT_REGISTRY["basic.auth.user.info"].encode()).decode()
    assert secret not in repr(seen)


def with_transform(transform):
    return {"name": "orders", "source": {"topics": ["orders"], "schema": "order_id STRING, customer STRING"},
            "target": {"table": "public.orders"}, "transform": transform}


@pytest.mark.parametrize("sql, why", [
    ("SELECT *, java_method('java.lang.System', 'getenv', 'LEDGERBATCH_DB_URL') AS note FROM batch", "reflection"),
    ("SELECT *, `reflect`('java.lang.System', 'getenv', 'X') AS note FROM batch", "reflection"),
    ("SELECT *, system.builtin.Try_Reflect/**/('java.lang.System', 'getenv', 'X') AS note FROM batch", "reflection"),
    ("SELECT TRANSFORM(order_id) USING 'cat /etc/passwd' AS (note) FROM batch", "runs a shell command"),
    ("SELECT b.*, f.value AS note FROM batch b CROSS JOIN text.`/etc/passwd` f", "reads a file"),
    ("SELECT b.*, f.value AS note FROM batch b CROSS JOIN parquet . `file:/tmp/x` f", "reads a file"),
    ("SELECT *, IDENTIFIER('reflect')('java.lang.System', 'getenv', 'X') AS note FROM batch", "builds a name"),
    # what Spark's lexer reads as code: a -- comment ends at a lone CR; a raw string's backslash escapes nothing
    ("SELECT *, -- note\rreflect('java.lang.System', 'getenv', 'X') AS note FROM batch", "reflection"),
    ("SELECT *, r'\\' AS a, reflect('java.lang.System', 'getenv', 'X') AS note FROM batch", "reflection"),
    ("SELECT TRANSFORM(order_id) USING r'sh -c env' AS (note) FROM batch", "runs a shell command"),
    # Spark substitutes ${...} before parsing: the environment, or an empty variable that splits a refused name
    ("SELECT *, '${env:AIRFLOW_CONN_LEDGERBATCH_DB}' AS note FROM batch", "a variable Spark would replace"),
    ("SELECT *, ref${hivevar:x}lect('java.lang.System', 'getenv', 'X') AS note FROM batch", "a variable"),
    ("SELECT TRANSFORM(order_id) USING ${hivevar:x}'id' AS (note) FROM batch", "a variable"),
    ("SELECT order_id, customer FROM batch -- ${system:user.home}", "a variable"),
    # a hint is code Spark parses, not a comment
    ("SELECT /*+ REPARTITION(java_method('java.lang.System', 'getenv', 'X')) */ *, 1 AS note FROM batch", "reflection"),
])
def test_a_transform_may_read_only_its_batch(sql, why):
    with pytest.raises(SpecError, match=f"transform: .*{why}.*a transform may read only its batch"):
        parse_spec(with_transform(sql))
    if sql.startswith("SELECT *, "):  # the per-column form of the same expression too
        expression = sql.removeprefix("SELECT *, ").rsplit(" AS note", 1)[0]
        with pytest.raises(SpecError, match=f"transform.customer: .*{why}"):
            parse_spec(with_transform({"customer": expression}))


def test_transforms_that_only_name_such_words_in_text_or_comments_pass():
    for sql in ("SELECT *, 'java_method reflect text.`/etc`' AS note FROM batch -- reflect(\n",
                "SELECT a.*, transform(array(customer), x -> upper(x)) AS t FROM batch a JOIN batch b USING (_offset)"):
        assert parse_spec(with_transform(sql)).query
    assert parse_spec(with_transform({"customer": "concat(customer, ':/', 'reflect')"})).transform


def test_a_spec_with_yaml_aliases_is_refused_before_it_expands(tmp_path):
    """Nested aliases (a few hundred bytes) expanded to 178 MB of canonical text in 16 s: refused at once."""
    import time

    from ledgerbatch.spec.pipeline import parse_spec_file

    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    path = tmp_path / "orders.yaml"
    path.write_text("name: orders\nsource: {topics: [orders], schema: 'order_id STRING'}\n"
                    "target: {table: public.orders}\ndescription:\n" + "".join(f"  {line}\n" for line in levels))
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"orders.yaml: not valid YAML: an alias \(\*a0\) is not allowed in a spec"):
        parse_spec_file(path)
    assert time.monotonic() - started < 1
