"""Create the demo topic on the compose stack's Kafka and fill it once with the demo orders."""
import os

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ledgerbatch.dev.demodata import produce_orders

BOOTSTRAP = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
TOPIC, PARTITIONS = "orders", int(os.environ.get("DEMO_PARTITIONS", "16"))
RECORDS = int(os.environ.get("DEMO_RECORDS", "200000"))

admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
if TOPIC not in admin.list_topics(timeout=30).topics:
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
    print(f"created topic {TOPIC} with {PARTITIONS} partitions")
consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "ledgerbatch-init"})
partitions = admin.list_topics(TOPIC, timeout=30).topics[TOPIC].partitions
present = sum(consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in partitions)
consumer.close()
if present:
    print(f"topic {TOPIC} already holds {present} offsets: no demo data produced")
else:
    produced = produce_orders(BOOTSTRAP, TOPIC, RECORDS, len(partitions), bad_every=1000)
    print(f"produced {RECORDS} records to {TOPIC}: {produced['good']} valid orders, {produced['bad']} bad records")
