"""Prometheus export (``GET /metrics``), written by prometheus_client from a collector over the broker.

Nothing is updated on the message path: each scrape reads the counters the queues already keep
(:class:`~pymq_server.broker.queue.QueueStats`) and turns them into metric families, on the event loop,
so the figures are one consistent snapshot.  Queues carry the label ``queue`` (the destination);
topic subscriptions are their own families with ``topic`` and ``subscription`` labels (two
subscriptions of one topic must not collide); temporary queues are left out (one label set per
connection would grow without bound).  ``process_*`` and ``python_info`` come from prometheus_client's
own collectors.  spec/admin.md lists every family.
"""
from __future__ import annotations

import platform
import sys
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.platform_collector import PlatformCollector

import pymq
from pymq_server.broker.vhosts import outside, vhost_of

# (family, key in queue_metrics(), counter?, help) for queues and, with other labels, subscriptions
QUEUE_FAMILIES = [
    ("depth", "depth", False, "Messages in the queue (ready, in flight, scheduled)"),
    ("ready", "ready", False, "Messages ready for delivery"),
    ("in_flight", "in_flight", False, "Messages delivered and not yet acknowledged"),
    ("scheduled", "scheduled", False, "Messages waiting for their delivery time or redelivery delay"),
    ("consumers", "consumers", False, "Consumers attached"),
    ("depth_average", "average_depth", False, "Time-weighted average depth since start"),
    ("depth_peak", "peak_depth", False, "Peak depth since start"),
    ("wait_seconds_average", "average_wait_s", False, "Average wait before first delivery"),
    ("wait_seconds_max", "max_wait_s", False, "Longest wait before first delivery"),
    ("added", "added", True, "Messages added"),
    ("delivered", "delivered", True, "Deliveries to consumers (redeliveries included)"),
    ("acknowledged", "acknowledged", True, "Messages acknowledged by consumers (auto acks included)"),
    ("removed", "removed", True, "Messages completed (acknowledged, purged or removed by an administrator)"),
    ("failed", "failed", True, "Failed deliveries (NACK, lost consumer, delivery timeout)"),
    ("expired", "expired", True, "Messages that expired"),
    ("dead_lettered", "dead_lettered", True, "Messages moved to the dead-letter queue (or dropped at "
                                             "the maximum when dead-lettering is off)"),
    ("dropped", "dropped", True, "Messages dropped by the overflow policy drop-oldest"),
    ("lag_seconds", "lag_s", False, "Age of the oldest message waiting (ready): how far behind the readers are"),
    ("acked_upto", "acked_upto", False, "The last pymq-ack-upto position: a range reader (the Spark connector's "
                                        "consume mode) has acknowledged everything below it"),
]


def _family(name: str, counter: bool, help_text: str, labels: list[str]):
    if counter:
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


class BrokerCollector:
    """A prometheus_client collector reading the broker at scrape time."""

    def __init__(self, admin) -> None:
        self.admin = admin

    def collect(self) -> Iterator[Metric]:
        admin = self.admin
        broker = admin.broker
        if broker is None:
            return
        from pymq_server.admin.ops import queue_metrics
        clock = broker.clock()
        info = InfoMetricFamily("pymq_build", "The broker's version, Python and whether the compiled core is used")
        info.add_metric([], {"version": pymq.__version__, "python": platform.python_version(),
                             "implementation": sys.implementation.name, "core": admin.core_kind(),
                             "node": broker.node_id})
        yield info
        yield GaugeMetricFamily("pymq_start_time_seconds", "When the broker started (Unix time)",
                                value=admin.started_at)
        ready, _ = admin.readiness()
        yield GaugeMetricFamily("pymq_ready", "1 when storage is open, recovery is done and the broker "
                                "listens (what /readyz answers)", value=1 if ready else 0)

        # every destination's family carries a 'vhost' label and names it as the vhost's clients do
        # (RabbitMQ's queue and vhost labels): /queue/orders of vhost shop is {queue="/queue/orders",vhost="shop"}
        queues = [(outside(q.destination), vhost_of(q.destination), queue_metrics(q, clock))
                  for q in admin.client_queues()]
        subs = [(outside(t.destination), s.name, "true" if s.durable else "false", vhost_of(t.destination),
                 queue_metrics(s.queue, clock)) for t in broker.topics.values() for s in t.subscriptions.values()]
        for suffix, key, counter, help_text in QUEUE_FAMILIES:
            fam = _family("pymq_queue_" + suffix, counter, help_text, ["queue", "vhost"])
            for destination, vhost, m in queues:
                fam.add_metric([destination, vhost], m[key])
            yield fam
            fam = _family("pymq_subscription_" + suffix, counter, help_text,
                          ["topic", "subscription", "durable", "vhost"])
            for topic, name, durable, vhost, m in subs:
                fam.add_metric([topic, name, durable, vhost], m[key])
            yield fam

        yield GaugeMetricFamily("pymq_queues", "Queues (temporary queues excluded)", value=len(queues))
        yield GaugeMetricFamily("pymq_topics", "Topics", value=len(broker.topics))
        yield GaugeMetricFamily("pymq_subscriptions", "Topic subscriptions (durable and not)", value=len(subs))
        published = CounterMetricFamily("pymq_topic_published", "Messages published to the topic",
                                        labels=["topic", "vhost"])
        per_topic = GaugeMetricFamily("pymq_topic_subscriptions", "Subscriptions of the topic",
                                      labels=["topic", "vhost"])
        for topic in broker.topics.values():
            labels = [outside(topic.destination), vhost_of(topic.destination)]
            published.add_metric(labels, topic.published)
            per_topic.add_metric(labels, len(topic.subscriptions))
        yield published
        yield per_topic
        yield from _vhost_families(admin)

        figures = admin.broker_figures()
        yield GaugeMetricFamily("pymq_connections", "Open client connections", value=figures["connections"])
        yield GaugeMetricFamily("pymq_held_bytes", "Message bytes held by the broker", value=figures["held_bytes"])
        yield GaugeMetricFamily("pymq_resident_bytes", "Broker memory held for messages and clients, estimated "
                                "(what max_memory bounds)", value=figures["resident_bytes"])
        yield GaugeMetricFamily("pymq_client_bytes", "Broker memory clients hold besides messages (subscriptions, "
                                "selectors, temporary destinations, browse ids, open transactions)",
                                value=figures["client_bytes"])
        yield GaugeMetricFamily("pymq_queue_entries", "Queue entries in memory", value=figures["entries"])
        yield GaugeMetricFamily("pymq_max_memory_bytes", "Broker memory held before producers are paused",
                                value=broker.config.max_memory)
        yield GaugeMetricFamily("pymq_memory_high", "1 while producers are paused for memory",
                                value=1 if figures["memory_high"] else 0)
        yield CounterMetricFamily("pymq_duplicates", "SENDs dropped by duplicate detection",
                                  value=figures["duplicates"])
        yield CounterMetricFamily("pymq_expired", "Messages that expired, all queues", value=figures["expired"])
        yield CounterMetricFamily("pymq_dropped_no_subscriber", "Topic messages nobody subscribed to",
                                  value=figures["dropped_no_subscriber"])
        yield GaugeMetricFamily("pymq_quarantined_records", "Stored records recovery could not decode, set aside "
                                "and kept (admin operation list-quarantine)", value=len(broker.quarantine))

        store = admin.server.store
        if store is not None:
            statuses = store.status()
            labels = ["device", "kind"]
            fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
                "messages": GaugeMetricFamily("pymq_device_messages", "Messages held per holding device",
                                              labels=labels),
                "bytes": GaugeMetricFamily("pymq_device_bytes", "Bytes held per holding device", labels=labels),
                "free": GaugeMetricFamily("pymq_device_free_bytes", "Free bytes per bounded device", labels=labels),
                "online": GaugeMetricFamily("pymq_device_online", "1 when the device is online", labels=labels),
                "errors": CounterMetricFamily("pymq_device_errors", "Failed device operations", labels=labels),
            }
            for s in statuses:
                device = [s.name, s.kind]
                fams["messages"].add_metric(device, s.messages)
                fams["bytes"].add_metric(device, s.bytes_used)
                if s.bytes_free is not None:
                    fams["free"].add_metric(device, s.bytes_free)
                fams["online"].add_metric(device, 1 if s.online else 0)
                fams["errors"].add_metric(device, s.errors)
            yield from fams.values()
            selection = store.selection
            if selection is not None:
                score = GaugeMetricFamily("pymq_device_score", "Storage monitor score (0 best, negative worse)",
                                          labels=["device"])
                for name, health in selection.describe().get("devices", {}).items():
                    score.add_metric([name], health["score"])
                yield score

        cluster = broker.cluster
        if cluster.active:
            status = cluster.status()
            yield GaugeMetricFamily("pymq_cluster_members", "Nodes in the cluster (this one included)",
                                    value=len(status["members"]))
            links = GaugeMetricFamily("pymq_cluster_link_ready", "1 when the link to the peer is up", labels=["peer"])
            for peer, ready in status["links"].items():
                links.add_metric([peer], 1 if ready else 0)
            yield links
            outbox = GaugeMetricFamily("pymq_cluster_outbox_depth", "Messages waiting for a peer", labels=["peer"])
            for peer, depth in status["outboxes"].items():
                outbox.add_metric([peer], depth)
            yield outbox


def _vhost_families(admin) -> Iterator[Metric]:
    """Per-vhost gauges (RabbitMQ's per-vhost figures): connections, queues, topics, messages, message memory
    and the vhost's limits, for '/' and every configured vhost."""
    from pymq_server.admin.vhost_ops import LIMITS, vhost_rows
    rows = vhost_rows(admin.broker)
    for key, name, help_text in (
            ("connections", "pymq_vhost_connections", "Open client connections in the virtual host"),
            ("queues", "pymq_vhost_queues", "Queues of the virtual host (temporary queues excluded)"),
            ("topics", "pymq_vhost_topics", "Topics of the virtual host"),
            ("depth", "pymq_vhost_messages", "Messages in the virtual host's queues"),
            ("memory_bytes", "pymq_vhost_memory_bytes", "Message memory the virtual host's messages hold (what its "
                                                        "max_memory bounds)")):
        fam = GaugeMetricFamily(name, help_text, labels=["vhost"])
        for row in rows:
            fam.add_metric([row["name"]], row[key])
        yield fam
    limit = GaugeMetricFamily("pymq_vhost_limit", "A virtual host's limit (max_connections, max_queues, max_memory); "
                              "absent when unset", labels=["vhost", "limit"])
    for row in rows:
        for key in LIMITS:
            value = row["limits"].get(key)
            if value is not None:
                limit.add_metric([row["name"], key], value)
    yield limit


def registry_for(admin, wrap=None) -> CollectorRegistry:
    """``wrap``: the multi-worker broker's collector over every worker's (server/cores/admin.py)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = BrokerCollector(admin)
    registry.register(wrap(collector) if wrap is not None else collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The scrape in the format the scraper's Accept header asks for (Prometheus text, or OpenMetrics)."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
