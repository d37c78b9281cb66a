"""The live stream processor: the four stages of ARCHITECTURE.md as a faust app.

Stages and their keys (every stage scales out as a Kafka consumer group; state lives in
changelog-backed tables, so a restarted or moved worker recovers it):

1. the allocation table is a *global* table (Kafka Streams' GlobalKTable pattern): every
   worker's hot stage reads all JobEvents itself and knows the owner of every GPU at every time.
   JobEvents are few (thousands a day on a 100,000-GPU cluster, against 12,500 samples a
   second), and reading them directly, up to the end offsets asked after each batch of samples
   was fetched, orders a job's start and end exactly before its own samples: a re-keyed,
   co-partitioned table fed by another stage cannot promise that.
2. the hot stage (samples, key node) runs on its own confluent-kafka consumer thread
   (:mod:`~peerwatch.streams.live.hot_stage`): batches of up to ``batch_max`` samples are decoded,
   attributed and aggregated by the pure
   :class:`~peerwatch.streams.core.windows.WindowAggregator`; closed windows leave as one compact
   record per (job, window) on ``<id>-window-batches`` keyed by job. Hard rules fire there on
   arrival and the silence watch runs there; their findings go straight to the findings topic
   and, keyed by node, to ``<id>-findings``. Faust's per-event overhead
   is the known bottleneck (profiled: more than decoding and aggregating), so samples never
   pass through it. Its offsets trail the oldest open window, so a crash loses no open window.
3. ``jobs`` (job-events + window batches, key job) gathers a job's windows from all its nodes and
   runs the pure detector; GpuWindow and StragglerFinding records go out, and findings go on to
   ``<id>-findings`` keyed by node.
4. ``policy`` (findings + health results + node events, key node) runs the pure drain policy and
   publishes DrainRecommendations (deterministic ids; the policy state dedupes replays).

Undecodable or invalid records go to the dead-letter topic with the reason in headers, and the
worker keeps running. Late samples (for windows already closed) are counted and sent to the
dead-letter topic with reason ``late``, never dropped silently.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import faust
import mode

from peerwatch.errors import CodecError
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import Settings, expand
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.job_stage import JobReleaser, PendingEntry, Released, batch_of_message
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.pipeline import PolicyStage
from peerwatch.streams.core.policy_state import NodePolicyState
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.hot_stage import HotStage, HotTopics
from peerwatch.streams.live.window_output import WindowOutput
from peerwatch.topics import TopicSpec, catalogue

log = logging.getLogger(__name__)


#: How often stage 3 walks its pending table for jobs pending from before a restart.
PENDING_SCAN_EVERY_S = 5.0


def _key_text(key: bytes | None) -> str:
    """A record key as text. Raises ValueError for a missing or non-UTF-8 key (dead-lettered by
    the agents, which go on)."""
    if key is None:
        raise ValueError("record without a key")
    return key.decode()


def _pending_message(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A pending-table entry as the batch message it holds, with its ``channel``: the message's
    text under ``raw``, or (entries written before that) the message's fields themselves."""
    if "raw" in entry:
        message = json.loads(entry["raw"])
        if not isinstance(message, dict):
            raise ValueError("pending entry: the message is no JSON object")
        return {**message, "channel": entry.get("channel")}
    return dict(entry)


@functools.lru_cache(maxsize=1 << 16)
def _samples_partition(node: str, partitions: int) -> int:
    """The samples partition of ``node``: Kafka's default keyed partitioner (murmur2), which the
    producers (librdkafka ``murmur2_random``) and faust (aiokafka) both use."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(node.encode()) & 0x7FFFFFFF) % partitions


def _faust_broker(settings: Settings) -> str:
    return ";".join(f"kafka://{hp.strip()}" for hp in settings.kafka.bootstrap_servers.split(","))


def _credentials(settings: Settings) -> Any:
    kafka = settings.kafka
    if kafka.security_protocol == "PLAINTEXT":
        return None
    from peerwatch.kafka_config import aiokafka_kwargs

    kw = aiokafka_kwargs(kafka)
    if kafka.sasl_mechanism:
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.reveal() if kafka.sasl_password else None,
            ssl_context=kw.get("ssl_context"),
            mechanism=kafka.sasl_mechanism,
        )
    return faust.SSLCredentials(kw["ssl_context"])


def internal_topics(settings: Settings) -> list[TopicSpec]:
    """The app's repartition topics: created up front (with the catalogue's partition counts) so
    that faust never auto-creates them with other counts and every agent finds them at start."""
    cfg = settings.stream
    app_id = settings.topic_prefix + cfg.app_id
    by_schema = {t.value_schema: t for t in catalogue(settings.topic_prefix)}
    nodes, jobs = by_schema["NodeGpuSample"].partitions, by_schema["JobEvent"].partitions
    day_ms = 24 * 3600 * 1000
    return [
        TopicSpec(f"{app_id}-window-batches", "job_id", None, jobs, "delete", day_ms,
                  "closed windows of one job from one worker, JSON (stage 2 -> 3)"),
        TopicSpec(f"{app_id}-findings", "node", None, nodes, "delete", 7 * day_ms,
                  "findings re-keyed by node, JSON (stage 3 -> 4)"),
    ]  # fmt: skip


def build_app(settings: Settings) -> faust.App:
    """The faust app with its topics, tables and agents (nothing connects until it runs); its
    settings are the tree's ``[stream]``, ``[detector]`` and ``[policy]`` tables."""
    cfg = settings.stream
    prefix = settings.topic_prefix
    topics = {t.value_schema or "deadletter": t for t in catalogue(prefix)}
    app_id = prefix + cfg.app_id
    datadir = expand(settings.state_dir) / "faust" / app_id
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id,
        broker=_faust_broker(settings),
        broker_credentials=_credentials(settings),
        store="memory://",
        # faust keeps a data folder per app; never in the current directory (a checkout).
        datadir=str(datadir),
        web_enabled=False,
        web_host="127.0.0.1",
        topic_partitions=topics["NodeGpuSample"].partitions,
        consumer_auto_offset_reset="earliest",
        producer_compression_type="lz4",
    )

    def raw_topic(name: str, **kw: Any) -> Any:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            value_serializer="raw",
            key_serializer="raw",
            **kw,
        )

    samples_t = raw_topic(topics["NodeGpuSample"].name)
    job_events_t = raw_topic(topics["JobEvent"].name)
    node_events_t = raw_topic(topics["NodeStateEvent"].name)
    health_t = raw_topic(topics["HealthCheckResult"].name)
    windows_out = raw_topic(topics["GpuWindow"].name)
    stragglers_out = raw_topic(topics["StragglerFinding"].name)
    recs_out = raw_topic(topics["DrainRecommendation"].name)
    deadletter = raw_topic(topics["deadletter"].name)
    node_partitions = topics["NodeGpuSample"].partitions
    job_partitions = topics["JobEvent"].partitions
    batches_t = app.topic(f"{app_id}-window-batches", partitions=job_partitions, internal=True,
                          key_type=bytes, value_serializer="json", key_serializer="raw")  # fmt: skip
    findings_t = app.topic(f"{app_id}-findings", partitions=node_partitions, internal=True,
                           key_type=bytes, value_serializer="json", key_serializer="raw")  # fmt: skip
    table_schema: Any = faust.Schema(key_serializer="raw", value_serializer="json")
    job_table = app.Table("jobs", default=None, partitions=job_partitions, schema=table_schema, key_type=bytes)  # fmt: skip
    # One entry per (job, window, source partition): a job's pending windows stay small records
    # (a 512-GPU job's whole state would not fit one Kafka message).
    pending_table = app.Table("pending", default=None, partitions=job_partitions, schema=table_schema, key_type=bytes)  # fmt: skip
    policy_table = app.Table("policy", default=None, partitions=node_partitions, schema=table_schema, key_type=bytes)  # fmt: skip

    codecs = {n: AvroCodec(n) for n in ("NodeGpuSample", "JobEvent", "NodeStateEvent",
                                        "HealthCheckResult", "GpuWindow", "StragglerFinding",
                                        "DrainRecommendation", "StepTime")}  # fmt: skip
    counters = StreamCounters()
    app.peerwatch_counters = counters  # type: ignore[attr-defined]

    async def dead(event: Any, reason: str, detail: str) -> None:
        counters.count_deadletter()
        msg = event.message
        headers = [
            ("peerwatch.reason", reason.encode()),
            ("peerwatch.error", detail[:1000].encode(errors="replace")),
            ("peerwatch.topic", str(msg.topic).encode()),
            ("peerwatch.partition", str(msg.partition).encode()),
            ("peerwatch.offset", str(msg.offset).encode()),
        ]
        await deadletter.send(key=event.key, value=msg.value, headers=headers)

    # -- stage 2: the hot path, on its own consumer thread (see hot_stage) ---------------------
    hot = HotStage(
        settings, app_id,
        HotTopics(
            samples=samples_t.get_topic_name(),
            job_events=job_events_t.get_topic_name(),
            batches=batches_t.get_topic_name(),
            deadletter=deadletter.get_topic_name(),
            job_partitions=job_partitions,
            findings=stragglers_out.get_topic_name(),
            node_findings=findings_t.get_topic_name(),
        ),
        counters,
        window_s=settings.detector.window_s, lateness_s=cfg.lateness_s, batch_max=cfg.batch_max,
        batch_within_s=cfg.batch_within_s, allocation_retention_s=cfg.allocation_retention_s,
        partition_of=lambda node: _samples_partition(node, node_partitions),
    )  # fmt: skip

    telemetry: list[Any] = []

    class HotService(mode.Service):
        """Starts the hot stage's thread with the app; stops it (final commit) with the app.
        Also peerwatch's own metrics (``[telemetry]``), read from the counters.
        (Defined here: importing mode's services at module level runs a subprocess.)"""

        async def on_started(self) -> None:
            from peerwatch.exporters.self_telemetry import start_self_telemetry

            hot.start()
            exporter = start_self_telemetry(settings.telemetry, "stream", counters.scalars)
            if exporter is not None:
                telemetry.append(exporter)

        async def on_stop(self) -> None:
            await asyncio.to_thread(hot.stop)
            for exporter in telemetry:
                await asyncio.to_thread(exporter.close)

    app.service(HotService())  # type: ignore[arg-type]

    # -- stage 3: per-job peer comparison (the pure JobReleaser; here decode, call, produce) -----
    job_meta = AllocationTable(cfg.allocation_retention_s * 1000)
    stage3 = JobReleaser(
        settings.detector, job_meta, grace_ms=int(cfg.job_grace_s * 1000),
        fan_out_job_wide=cfg.fan_out_job_wide,
        partition_of=lambda node: _samples_partition(node, node_partitions),
    )  # fmt: skip
    pending_scan = [0.0]  # monotonic s of the next walk of the pending table (see jobs)
    # (job, window start) -> wall ms when the last samples partition closed it (latency only).
    closed_wall: dict[tuple[str, int], float] = {}

    def on_finding_sent(closed_ms: float | None) -> Any:
        def acked(_fut: Any) -> None:
            if closed_ms is not None:
                counters.latency(time.time() * 1000.0 - closed_ms)

        return acked

    def restore(job_id: str) -> None:
        """First sight of the job in this process: recover its state from the tables."""
        if stage3.seen(job_id):
            return
        saved = job_table.get(job_id.encode()) or {}
        for ev in saved.get("events") or []:
            job_meta.apply_event(ev)
        pending = [
            _pending_message(b)
            for key, b in list(pending_table.items())
            if b and PendingEntry.from_key(key.decode()).job_id == job_id
        ]
        for entry in stage3.restore(job_id, saved, pending):
            pending_table.pop(entry.key.encode(), None)

    # Scored windows leave through librdkafka, flushed before each commit (see window_output).
    window_output = WindowOutput(settings.kafka, windows_out.get_topic_name())
    window_output.guard_commits(app.producer)

    async def publish(released: Released) -> None:
        for entry in released.retired:
            pending_table.pop(entry.key.encode(), None)
        for job_id, state in released.saved.items():
            job_table[job_id.encode()] = {**(job_table.get(job_id.encode()) or {}), **state}
        for r in released.releases:
            key = r.context.job_id.encode()
            closed_ms = closed_wall.pop((r.context.job_id, r.window_start_ms), None)
            encode = codecs["GpuWindow"].encode
            for w in r.result.windows:
                window_output.send(key, encode(w))
            counters.windows += len(r.result.windows)
            for f, copies in zip(r.result.findings, r.to_nodes, strict=True):
                counters.findings += 1
                await stragglers_out.send(
                    key=key,
                    value=codecs["StragglerFinding"].encode(f),
                    callback=on_finding_sent(closed_ms),
                )
                for copy in copies:
                    await findings_t.send(key=str(copy["node"]).encode(), value=copy)

    # Step times (optional, keyed by job like the job events and window batches): a GPU's
    # window gets the mean step duration of its steps in that window before detection.
    step_times_name = topics["StepTime"].name

    @app.agent(app.topic(job_events_t.get_topic_name(), batches_t.get_topic_name(), step_times_name,
                         key_type=bytes, key_serializer="raw", value_serializer="raw"),
               name=f"{app_id}-jobs")  # fmt: skip
    async def jobs(stream: Any) -> None:
        async for event in stream.events():
            partition = event.message.partition
            try:
                if event.message.topic == step_times_name:
                    step = codecs["StepTime"].decode(event.value)
                    counters.step_times += 1
                    restore(str(step["job_id"]))
                    stage3.add_step(step)
                    continue
                if event.message.topic == job_events_t.get_topic_name():
                    job_id = _key_text(event.key)
                    restore(job_id)
                    job = codecs["JobEvent"].decode(event.value)
                    job_meta.apply_event(job)
                    saved = dict(job_table.get(event.key) or {})
                    saved["events"] = [*(saved.get("events") or []), job][-8:]
                    job_table[event.key] = saved
                    continue
                b = json.loads(event.value)
                if b.get("kind") == "watermark":
                    # Jobs with windows pending from before a restart (or a rebalance) and no
                    # batch since: the table is walked every few seconds, not at every
                    # heartbeat (there are several per batch, and the table can be large).
                    now_s = time.monotonic()
                    if now_s >= pending_scan[0]:
                        pending_scan[0] = now_s + PENDING_SCAN_EVERY_S
                        for key in list(pending_table.keys()):
                            restore(PendingEntry.from_key(key.decode()).job_id)
                        # Ended jobs are forgotten here as in replay (Pipeline._closed_to).
                        low_ms = stage3.low_watermark_ms()
                        if low_ms is not None:
                            job_meta.prune(low_ms)
                            stage3.prune(low_ms, cfg.allocation_retention_s * 1000)
                    until = int(b["closed_until_ms"])
                    await publish(stage3.heartbeat(int(b["src"]), until, channel=partition))
                    continue
                batch, src = batch_of_message(b)
                restore(batch.job_id)
                if not stage3.add(batch, src, channel=partition):
                    continue  # a window already released (re-sent after a hot-stage restart)
                job_id, start = batch.job_id, batch.window_start_ms
                wall = b.get("closed_wall_ms")
                if wall is not None:
                    closed_wall[(job_id, start)] = max(closed_wall.get((job_id, start), 0.0), wall)
                entry = PendingEntry(job_id, start, src)
                # The message as it came (a string: no second encoding of every window).
                pending_table[entry.key.encode()] = {
                    "raw": event.value.decode(), "channel": partition,
                }  # fmt: skip
                await publish(stage3.release(job_id))
            except (CodecError, InvalidRecordError, KeyError, ValueError, TypeError) as exc:
                await dead(event, "invalid", str(exc))

    # -- stage 4: the drain policy, keyed by node -----------------------------------------------------
    policy = PolicyStage(settings.policy)
    loaded_nodes: set[str] = set()

    @app.agent(app.topic(findings_t.get_topic_name(), health_t.get_topic_name(), node_events_t.get_topic_name(),
                         key_type=bytes, key_serializer="raw", value_serializer="raw"),
               name=f"{app_id}-policy")  # fmt: skip
    async def policy_agent(stream: Any) -> None:
        async for event in stream.events():
            try:
                node = _key_text(event.key)
            except ValueError as exc:  # no key, or not UTF-8: nothing to key the node's state by
                await dead(event, "invalid", str(exc))
                continue
            if node not in loaded_nodes:
                saved = policy_table.get(event.key)
                if saved:
                    policy.state.nodes[node] = NodePolicyState.from_dict(saved)
                loaded_nodes.add(node)
            topic = event.message.topic
            try:
                if topic == findings_t.get_topic_name():
                    record = json.loads(event.value)
                elif topic == health_t.get_topic_name():
                    record = codecs["HealthCheckResult"].decode(event.value)
                else:
                    record = codecs["NodeStateEvent"].decode(event.value)
                recs = policy.apply(record)
            except (CodecError, InvalidRecordError, KeyError, ValueError, TypeError) as exc:
                await dead(event, "invalid", str(exc))
                continue
            if node in policy.state.nodes:
                policy_table[event.key] = policy.state.nodes[node].to_dict()
            for r in recs:
                counters.recommendations += 1
                await recs_out.send(
                    key=str(r["node"]).encode(), value=codecs["DrainRecommendation"].encode(r)
                )

    @app.timer(interval=30.0)  # type: ignore[untyped-decorator]
    async def report_counters() -> None:
        log.info("stream counters: %s", {k: v for k, v in counters.snapshot().items()
                                          if k not in ("finding_latency_ms", "batch_log")})  # fmt: skip

    if cfg.counters_path:
        counters_path = cfg.counters_path

        @app.timer(interval=cfg.counters_interval_s)  # type: ignore[untyped-decorator]
        async def write_counters() -> None:
            counters.write(counters_path)

    return app
