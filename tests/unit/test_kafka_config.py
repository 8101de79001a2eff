from ledgerbatch.source.kafka import consumer_config


def test_user_options_cannot_override_the_exactness_settings():
    conf = consumer_config("b:9092", {"auto.offset.reset": "earliest", "isolation.level": "read_uncommitted",
                                      "enable.auto.commit": "true", "security.protocol": "SSL"})
    assert conf["auto.offset.reset"] == "error" and conf["isolation.level"] == "read_committed"
    assert conf["enable.auto.commit"] is False and conf["security.protocol"] == "SSL"
