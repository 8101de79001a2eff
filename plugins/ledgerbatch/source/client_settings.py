"""Who may set which librdkafka setting of a ledgerbatch consumer.

The deployment (KAFKA_BOOTSTRAP_SERVERS and LEDGERBATCH_KAFKA_OPTIONS, or the Airflow connection
ledgerbatch_kafka) owns the brokers and every security setting, with its credentials. A spec's
`source.kafka` may only tune how records are fetched (SPEC_SETTINGS): a spec able to name the brokers or
the SASL mechanism could send the deployment's password to a server of its author's choice, and
`plugin.library.paths` would load native code into every process that reads the spec. ledgerbatch
itself sets what makes a range exact (SAFETY), over everyone.
"""
from __future__ import annotations

from ledgerbatch.errors import SpecError

SAFETY = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "auto.offset.reset": "error",  # a range that left the log fails loudly instead of skipping
}

# Fetch sizes and waits, buffers, timeouts and retries, identification: none carries or chooses a
# credential, a server, a file or code.
SPEC_SETTINGS = (
    "api.version.request.timeout.ms", "broker.address.family", "check.crcs", "client.id", "client.rack",
    "connections.max.idle.ms", "fetch.error.backoff.ms", "fetch.max.bytes", "fetch.message.max.bytes",
    "fetch.min.bytes", "fetch.queue.backoff.ms", "fetch.wait.max.ms", "max.partition.fetch.bytes",
    "metadata.max.age.ms", "queued.max.messages.kbytes", "queued.min.messages", "receive.message.max.bytes",
    "reconnect.backoff.max.ms", "reconnect.backoff.ms", "retry.backoff.max.ms", "retry.backoff.ms",
    "socket.connection.setup.timeout.ms", "socket.keepalive.enable", "socket.nagle.disable",
    "socket.receive.buffer.bytes", "socket.timeout.ms", "topic.metadata.refresh.interval.ms",
)

_DEPLOYMENT = "the deployment's (LEDGERBATCH_KAFKA_OPTIONS, or the Airflow connection ledgerbatch_kafka)"
_WHY = (  # (prefixes or names, why a spec may not set it), first match wins
    (("bootstrap.servers", "metadata.broker.list"),
     "the brokers are the deployment's (KAFKA_BOOTSTRAP_SERVERS, or the Airflow connection ledgerbatch_kafka)"),
    (("plugin.", "sasl.kerberos.kinit.cmd", "oauthbearer_token_refresh_cb", "oc_cb", "error_cb", "log_cb",
      "stats_cb", "throttle_cb"), "it loads code or runs a command in every process that reads the spec"),
    (("security.", "sasl.", "ssl.", "ssl_", "enable.ssl.", "enable.sasl.", "https."),
     f"security settings and their credentials are {_DEPLOYMENT}"),
    (tuple(SAFETY) + ("group.id", "group.instance.id", "enable.partition.eof"),
     "ledgerbatch sets it itself: the offset ranges are exact only with its value"),
)


def check_spec_settings(options: dict) -> dict[str, str]:
    """A spec's `source.kafka` as text, or a SpecError naming the first key a spec may not set and why."""
    for key in sorted(map(str, options)):
        if key in SPEC_SETTINGS:
            continue
        why = next((reason for names, reason in _WHY if key.startswith(names)),
                   f"a spec may set only these fetch settings: {', '.join(SPEC_SETTINGS)}")
        raise SpecError(f"source.kafka: {key!r} cannot be set in a spec: {why}")
    return {str(k): str(v) for k, v in options.items()}
