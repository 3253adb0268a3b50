"""Read and write options: parsed values and the errors a wrong one gives (no Spark needed)."""
from __future__ import annotations

import pytest

from pymq.errors import ConfigError
from pyspark_pymq._options import ConnectionOptions, ReadOptions, WriteOptions

URL = "stomp://127.0.0.1:61613"


def read(streaming=False, **opts):
    return ReadOptions.parse({"url": URL, **opts}, streaming=streaming)


def refused(pattern, streaming=False, **opts):
    with pytest.raises(ConfigError, match=pattern):
        read(streaming, **opts)


def test_defaults_and_destination_spellings():
    o = read(topic="orders,returns")
    assert o.destinations == ("/topic/orders", "/topic/returns")
    assert (o.mode, o.ending, o.starting, o.fail_on_data_loss, o.include_properties) == \
        ("browse", "latest", None, True, False)
    assert read(queue="/queue/a").destinations == ("/queue/a",)
    assert read(destinations="/queue/a, /topic/b").destinations == ("/queue/a", "/topic/b")
    # Spark option names are case-insensitive
    assert ReadOptions.parse({"URL": URL, "Queue": "x", "MINPARTITIONS": "3"}, False).min_partitions == 3


def test_exactly_one_source():
    refused("exactly one of", queue="a", topic="b")
    refused("exactly one of")
    refused("not a queue", queue="/topic/x")
    refused("starting with /queue/", destinations="orders")
    refused("named twice", topic="a,a")
    refused("temporary queue", destinations="/temp-queue/x")


def test_a_pattern_is_resolved_by_the_source():
    o = read(destinationPattern="/topic/m.*")
    assert (o.pattern, o.destinations) == ("/topic/m.*", ())
    refused("exactly one of", destinations="/queue/a", destinationPattern="/topic/*")
    # the broker's wildcard syntax (spec/routing.md §5); an old glob is refused, not read literally
    refused("takes /topic/<pattern> or /queue/<pattern>", destinationPattern="m.*")
    refused("takes /topic/<pattern> or /queue/<pattern>", destinationPattern="/*/orders")
    refused("not a glob", destinationPattern="/queue/orders-*")
    refused("not a glob", destinationPattern="/topic/ok.#,/topic/m?")
    assert read(destinationPattern="/topic/a.*, /queue/b.>").pattern == "/topic/a.*, /queue/b.>"
    refused("must start with /topic/", destinationPattern="/topic/a.*,/queue/b.*", subscription="s")
    assert read(destinationPattern="/topic/a.*,/topic/b.#", subscription="s").subscription == "s"
    refused("needs the destinations named", streaming=True, destinationPattern="/queue/#", mode="consume")


def test_offsets():
    o = read(topic="a,b", startingOffsets='{"/topic/a": {"0": 5}, "b": {"0": -2}}',
             endingOffsets='{"/topic/a": {"0": -1}}')
    assert o.starting == {"/topic/a": 5, "/topic/b": -2} and o.ending == {"/topic/a": -1}
    assert read(topic="a", startingOffsets="EARLIEST").starting == "earliest"
    refused("'earliest', 'latest' or JSON", topic="a", startingOffsets="first")
    refused("does not read", topic="a", startingOffsets='{"/topic/zz": {"0": 1}}')
    refused("partition \"0\"", topic="a", startingOffsets='{"/topic/a": {"1": 1}}')
    refused("-1 \\(latest\\); got -2", topic="a", endingOffsets='{"/topic/a": {"0": -2}}')
    refused("cannot be 'earliest'", topic="a", endingOffsets="earliest")
    refused("not startingOffsets and startingTimestamp", topic="a", startingOffsets="earliest",
            startingTimestamp="5")
    refused("for batch reads", streaming=True, topic="a", endingOffsets="latest")
    refused("for streaming queries", topic="a", maxMessagesPerTrigger="10")


def test_consume_mode_rules():
    o = read(streaming=True, topic="a", mode="consume", subscription="q1")
    assert (o.mode, o.subscription) == ("consume", "q1")
    refused("needs a streaming query", topic="a", mode="consume", subscription="s")
    refused("needs option 'subscription'", streaming=True, topic="a", mode="consume")
    refused("acknowledged unread", streaming=True, queue="a", mode="consume", selector="n > 1")
    refused("one topic per subscription", streaming=True, topic="a,b", mode="consume", subscription="s")
    refused("starts where the subscription", streaming=True, queue="a", mode="consume",
            startingOffsets="earliest")
    refused("is a queue", queue="a", subscription="s")
    refused("'browse' or 'consume'", queue="a", mode="drain")


def test_values_and_typos():
    refused("not a valid JMS selector", queue="a", selector="n >")
    refused("did you mean 'startingOffsets'", queue="a", startingOffset="earliest")
    refused("must be an integer", queue="a", minPartitions="two")
    refused("at least 1", queue="a", fetchSize="0")
    refused("true or false", queue="a", failOnDataLoss="maybe")
    refused("client id can be held by one live connection", queue="a", **{"pymq.clientId": "x"})
    with pytest.raises(ConfigError, match="'url' is required"):
        ReadOptions.parse({"queue": "a"}, False)
    with pytest.raises(ConfigError, match="stomp://"):
        ReadOptions.parse({"url": "vm://default", "queue": "a"}, False)


def test_connection_options_pass_through_and_hide_the_password():
    c = ConnectionOptions.parse({"url": URL, "pymq.username": "app", "pymq.password": "s3cret",
                                 "pymq.timeout": "2.5", "pymq.heartbeat": "0,0"})
    assert (c.username, c.password, c.timeout, c.heartbeat) == ("app", "s3cret", 2.5, (0, 0))
    assert "s3cret" not in repr(c)
    assert hash(c) == hash(ConnectionOptions.parse({"url": URL, "pymq.username": "app",
                                                    "pymq.password": "s3cret", "pymq.timeout": "2.5",
                                                    "pymq.heartbeat": "0,0"}))
    with pytest.raises(ConfigError, match="send_ms,recv_ms"):
        ConnectionOptions.parse({"url": URL, "pymq.heartbeat": "10"})


def test_write_options():
    w = WriteOptions.parse({"url": URL, "queue": "out", "dedup": "true", "deliveryMode": "non_persistent",
                            "priority": "7", "timeToLive": "1000"})
    assert (w.destination, w.dedup, w.delivery_mode, w.priority, w.time_to_live) == ("/queue/out", True, 1, 7, 1000)
    assert WriteOptions.parse({"url": URL}).destination is None
    for opts, pattern in [({"queue": "a", "topic": "b"}, "at most one"),
                          ({"priority": "10"}, "between 0 and 9"),
                          ({"dedupPrefix": "x"}, "only has a meaning with dedup=true"),
                          ({"deliveryMode": "sometimes"}, "'persistent' or 'non_persistent'"),
                          ({"startingOffsets": "earliest"}, "unknown write option")]:
        with pytest.raises(ConfigError, match=pattern):
            WriteOptions.parse({"url": URL, **opts})


def test_kafka_parity_options():
    o = read(topic="a,b", startingOffsetsByTimestamp='{"/topic/a": {"0": 1700000000000}}',
             endingOffsetsByTimestamp='{"b": {"0": 1700000009000}}')
    assert o.starting_by_timestamp == {"/topic/a": 1700000000000}
    assert o.ending_by_timestamp == {"/topic/b": 1700000009000}
    assert read(topic="a", endingTimestamp="17").ending_timestamp == 17
    refused("ms since the epoch", topic="a", startingOffsetsByTimestamp="earliest")
    refused("must be ms since the epoch", topic="a", startingOffsetsByTimestamp='{"/topic/a": {"0": -1}}')
    refused("not startingTimestamp and startingOffsetsByTimestamp", topic="a", startingTimestamp="1",
            startingOffsetsByTimestamp='{"/topic/a": {"0": 1}}')
    refused("not endingOffsets and endingTimestamp", topic="a", endingOffsets="latest", endingTimestamp="3")
    refused("'endingTimestamp' is for batch reads", streaming=True, topic="a", endingTimestamp="3")
    refused("cannot be used with mode 'consume'", streaming=True, queue="a", mode="consume",
            startingOffsetsByTimestamp='{"/queue/a": {"0": 1}}')

    s = read(streaming=True, topic="a", maxOffsetsPerTrigger="100", minOffsetsPerTrigger="10",
             maxTriggerDelay="30s")
    assert (s.max_messages_per_trigger, s.min_messages_per_trigger, s.max_trigger_delay_ms) == (100, 10, 30_000)
    assert read(streaming=True, topic="a", minMessagesPerTrigger="5").max_trigger_delay_ms == 15 * 60_000
    assert read(streaming=True, topic="a", minOffsetsPerTrigger="5", maxTriggerDelay="250").max_trigger_delay_ms \
        == 250
    refused("mean the same", streaming=True, topic="a", maxOffsetsPerTrigger="1", maxMessagesPerTrigger="2")
    refused("no micro-batch could satisfy both", streaming=True, topic="a", maxOffsetsPerTrigger="5",
            minOffsetsPerTrigger="6")
    refused("with that option", streaming=True, topic="a", maxTriggerDelay="5m")
    refused("a duration such as", streaming=True, topic="a", minOffsetsPerTrigger="5", maxTriggerDelay="soon")
    refused("for streaming queries", topic="a", minOffsetsPerTrigger="5")

    r = read(topic="a", fetchRetries="0", fetchRetryIntervalMs="5")
    assert (r.fetch_retries, r.fetch_retry_interval_ms) == (0, 5)
    assert (read(topic="a").fetch_retries, read(topic="a").fetch_retry_interval_ms) == (3, 1000)


def test_every_connection_factory_keyword_passes_through():
    import inspect

    import pymq
    c = ConnectionOptions.parse({"url": URL, "pymq.prefetch": "7", "pymq.sync_send": "false",
                                 "pymq.host": "vhost", "pymq.syncsend": "false"})
    assert (c.get("prefetch"), c.get("sync_send"), c.get("host"), c.get("timeout")) == (7, False, "vhost", 30.0)
    # whatever pymq.ConnectionFactory takes (TLS settings included, once it has them) is an option
    keywords = [n for n in inspect.signature(pymq.ConnectionFactory.__init__).parameters
                if n not in ("self", "url", "client_id")]
    assert {"username", "password", "timeout", "heartbeat", "host", "prefetch", "sync_send"} <= set(keywords)
    for keyword in keywords:
        try:
            ConnectionOptions.parse({"url": URL, f"pymq.{keyword}": "\x00not a value\x00"})
        except ConfigError as exc:                      # a wrong value, never an unknown option
            assert "unknown connection option" not in str(exc) and f"pymq.{keyword}" in str(exc)
    with pytest.raises(ConfigError, match="did you mean 'pymq.prefetch'"):
        ConnectionOptions.parse({"url": URL, "pymq.prefech": "1"})
    with pytest.raises(ConfigError, match="must be true or false"):
        ConnectionOptions.parse({"url": URL, "pymq.sync_send": "sometimes"})
