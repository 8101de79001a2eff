"""The dev broker: librdkafka's mock cluster, a real Kafka-protocol server on 127.0.0.1, through its C API.

Only the demo and the tests use it. Everything else talks to Kafka through the ordinary
confluent-kafka client, so a real cluster works unchanged.
"""
from __future__ import annotations

import ctypes
import glob
import os
import signal
import threading

import confluent_kafka

from ledgerbatch.errors import ConfigError

_RD_KAFKA_PRODUCER = 0


def _library() -> ctypes.CDLL:
    libs_dir = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), "confluent_kafka.libs")
    found = sorted(glob.glob(os.path.join(libs_dir, "librdkafka*.so*")))
    if not found:
        raise ConfigError(f"librdkafka not found in {libs_dir}: install the confluent-kafka wheel (not a source build)")
    lib = ctypes.CDLL(found[0])
    vp, ci, cs = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    signatures = {
        "rd_kafka_conf_new": ([], vp),
        "rd_kafka_conf_set": ([vp, cs, cs, cs, ctypes.c_size_t], ci),
        "rd_kafka_new": ([ci, vp, cs, ctypes.c_size_t], vp),
        "rd_kafka_destroy": ([vp], None),
        "rd_kafka_mock_cluster_new": ([vp, ci], vp),
        "rd_kafka_mock_cluster_destroy": ([vp], None),
        "rd_kafka_mock_cluster_bootstraps": ([vp], cs),
        "rd_kafka_mock_topic_create": ([vp, cs, ci, ci], ci),
        "rd_kafka_mock_broker_set_down": ([vp, ctypes.c_int32], ci),
        "rd_kafka_mock_broker_set_up": ([vp, ctypes.c_int32], ci),
        "rd_kafka_err2str": ([ci], cs),
    }
    for name, (args, res) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


class DevBroker:
    """A mock Kafka cluster that lives as long as this object (and its process)."""

    def __init__(self, brokers: int = 3):
        self._lib = _library()
        errstr = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        # The handle only hosts the cluster; keep its own logging quiet.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
        self._rk = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self._rk:
            raise ConfigError(f"dev broker: rd_kafka_new failed: {errstr.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._cluster:
            self._lib.rd_kafka_destroy(self._rk)
            raise ConfigError("dev broker: rd_kafka_mock_cluster_new failed")
        self.bootstrap_servers = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()
        self.brokers = brokers

    def create_topic(self, name: str, partitions: int) -> None:
        self._check(self._lib.rd_kafka_mock_topic_create(self._cluster, name.encode(), partitions, 1), f"create topic {name}")

    def broker_down(self, broker_id: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._cluster, broker_id), f"broker {broker_id} down")

    def broker_up(self, broker_id: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._cluster, broker_id), f"broker {broker_id} up")

    def close(self) -> None:
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._lib.rd_kafka_destroy(self._rk)
            self._cluster = self._rk = None

    def __enter__(self) -> "DevBroker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check(self, err: int, what: str) -> None:
        if err:
            raise ConfigError(f"dev broker: {what}: {self._lib.rd_kafka_err2str(err).decode()}")


def serve_forever(brokers: int, topics: dict[str, int]) -> None:
    """Foreground dev broker for `ledgerbatch dev-broker`: prints the bootstrap address, stops on SIGINT/SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with DevBroker(brokers) as broker:
        for name, partitions in topics.items():
            broker.create_topic(name, partitions)
        print(broker.bootstrap_servers, flush=True)
        stop.wait()
