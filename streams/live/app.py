"""The live stream processor: the four stages of ARCHITECTURE.md as a faust app.

Stages and their keys (every stage scales out as a Kafka consumer group; state lives in
changelog-backed tables, so a restarted or moved worker recovers it):

1. the allocation table is a *global* table (Kafka Streams' GlobalKTable pattern): every
   worker's hot stage reads all JobEvents itself and knows the owner of every GPU at every time.
   JobEvents are few (thousands a day on a 100,000-GPU cluster, against 12,500 samples a
   second), and reading them directly, up to the end offsets asked after each batch of samples
   was fetched, orders a job's start and end exactly before its own samples: a re-keyed,
   co-partitioned table fed by another stage cannot promise that.
2. the hot stage (samples, key node) runs on its own confluent-kafka consumer
   (:mod:`~peerwatch.streams.live.hot_stage`), in a process of its own beside this one
   (:mod:`~peerwatch.streams.live.hot_process`; ``stream.hot_process``): batches of up to ``batch_max`` samples are decoded,
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
import logging
import time
from typing import Any

import faust
import mode

from peerwatch.io.deadletter import dead_letter_headers, without_payload
from peerwatch.settings import Settings, expand
from peerwatch.signing import signer_of
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.job_stage import JobReleaser
from peerwatch.streams.core.network_jobs import JobNetwork
from peerwatch.streams.core.policy_stage import PolicyStage
from peerwatch.streams.live.commit_floor import hold_commits
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.handlers import RECORD_ERRORS, JobsHandler, PolicyHandler
from peerwatch.streams.live.hot_process import HotProcess
from peerwatch.streams.live.hot_spec import HotSpec, HotTopics, samples_partition
from peerwatch.streams.live.json_table import JsonTable, counting
from peerwatch.streams.live.window_output import WindowOutput
from peerwatch.topics import TopicSpec, catalogue

log = logging.getLogger(__name__)


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
            password=kafka.password(),
            ssl_context=kw.get("ssl_context"),
            mechanism=kafka.sasl_mechanism,
        )
    return faust.SSLCredentials(kw["ssl_context"])


def internal_topics(settings: Settings) -> list[TopicSpec]:
    """The app's repartition topics and its tables' changelogs: created up front (with the
    catalogue's partition counts) so that faust never auto-creates them with other counts and
    every agent finds them at start (a changelog faust failed to create under load left the
    policy agent crashing on ``PartitionsMismatch`` at every restart of it, 0 partitions)."""
    cfg = settings.stream
    app_id = settings.topic_prefix + cfg.app_id
    by_schema = {t.value_schema: t for t in catalogue(settings.topic_prefix, cfg.node_partitions)}
    nodes, jobs = by_schema["NodeGpuSample"].partitions, by_schema["JobEvent"].partitions
    day_ms = 24 * 3600 * 1000
    return [
        TopicSpec(f"{app_id}-window-batches", "job_id", None, jobs, "delete", day_ms,
                  "closed windows of one job from one worker, JSON (stage 2 -> 3)"),
        TopicSpec(f"{app_id}-findings", "node", None, nodes, "delete", 7 * day_ms,
                  "findings re-keyed by node, JSON (stage 3 -> 4)"),
        *(TopicSpec(f"{app_id}-{table}-changelog", key, None, jobs if key == "job_id" else nodes,
                    "compact", -1, f"changelog of the {table} table (faust's, compacted)")
          for table, key in _TABLES.items()),
    ]  # fmt: skip


#: The app's state tables (faust names their changelogs ``<app id>-<table>-changelog``) and
#: their keys: tables keyed by job have the job events' partitions, by node the samples'.
_TABLES = {"jobs": "job_id", "pending": "job_id", "policy": "node"}


def build_app(settings: Settings) -> faust.App:
    """The faust app with its topics, tables and agents (nothing connects until it runs); its
    settings are the tree's ``[stream]``, ``[detector]`` and ``[policy]`` tables."""
    cfg = settings.stream
    prefix = settings.topic_prefix
    topics = {t.value_schema or "deadletter": t for t in catalogue(prefix, cfg.node_partitions)}
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
    # The state tables are raw bytes to faust and JSON to the handlers (see json_table): a
    # damaged changelog entry is dropped there instead of stopping faust's recovery.
    job_table_raw = app.Table("jobs", default=None, partitions=job_partitions, key_type=bytes, value_type=bytes)  # fmt: skip
    # One entry per (job, window, source partition): a job's pending windows stay small records
    # (a 512-GPU job's whole state would not fit one Kafka message).
    # Entries are the batch messages as they came (handlers.pending_entry): raw bytes. faust
    # takes a table's serializers from its key and value types (not from its schema): without
    # value_type=bytes its changelog was read back as JSON, every entry failed to decode and
    # the recovery never completed (tests/integration/test_chaos.py, pending windows).
    pending_table = app.Table("pending", default=None, partitions=job_partitions, key_type=bytes, value_type=bytes)  # fmt: skip
    policy_table_raw = app.Table("policy", default=None, partitions=node_partitions, key_type=bytes, value_type=bytes)  # fmt: skip

    counters = StreamCounters()
    app.peerwatch_counters = counters  # type: ignore[attr-defined]
    job_table = JsonTable(job_table_raw, counting(counters, "jobs"))
    policy_table = JsonTable(policy_table_raw, counting(counters, "policy"))

    async def dead(event: Any, reason: str, detail: str) -> None:
        counters.count_deadletter()
        msg = event.message
        headers = dead_letter_headers(reason, detail, stage="stream", topic=str(msg.topic),
                                      partition=msg.partition, offset=msg.offset)  # fmt: skip
        key, value = event.key, msg.value
        if len(key or b"") + len(value or b"") > app.conf.producer_max_request_size - 10_000:
            key, sizes = without_payload(key, value)  # aiokafka would refuse it: not sent whole
            value, headers = None, [*headers, *sizes]
        await deadletter.send(key=key, value=value, headers=headers)

    # -- stage 2: the hot path, on its own consumer (see hot_stage), in a process of its own
    # (see hot_process) or a thread of this one ----------------------------------------------
    hot_spec = HotSpec(
        settings, app_id,
        HotTopics(
            samples=samples_t.get_topic_name(),
            job_events=job_events_t.get_topic_name(),
            batches=batches_t.get_topic_name(),
            deadletter=deadletter.get_topic_name(),
            job_partitions=job_partitions,
            findings=stragglers_out.get_topic_name(),
            node_findings=findings_t.get_topic_name(),
            nic_samples=topics["NodeNicSample"].name,
        ),
        node_partitions,
    )  # fmt: skip
    hot: Any = None

    telemetry: list[Any] = []

    class HotService(mode.Service):
        """Starts the hot stage's thread with the app; stops it (final commit) with the app.
        Also peerwatch's own metrics (``[telemetry]``), read from the counters.
        (Defined here: importing mode's services at module level runs a subprocess.)"""

        async def on_started(self) -> None:
            from peerwatch.exporters.telemetry_start import start_self_telemetry

            nonlocal hot
            if cfg.hot_process:
                hot = HotProcess(hot_spec, counters, logging.getLogger().getEffectiveLevel())
            else:
                hot = hot_spec.build(counters)
            hot.start()
            exporter = start_self_telemetry(settings.telemetry, "stream", counters.scalars)
            if exporter is not None:
                telemetry.append(exporter)

        async def on_stop(self) -> None:
            if hot is not None:
                await asyncio.to_thread(hot.stop)
            for exporter in telemetry:
                await asyncio.to_thread(exporter.close)

    app.service(HotService())  # type: ignore[arg-type]

    # -- stage 3: per-job peer comparison (the pure JobReleaser; see handlers) -------------------
    job_meta = AllocationTable(cfg.allocation_retention_s * 1000)
    stage3 = JobReleaser(
        settings.detector, job_meta, grace_ms=int(cfg.job_grace_s * 1000),
        fan_out_job_wide=cfg.fan_out_job_wide,
        partition_of=lambda node: samples_partition(node, node_partitions),
        fleet_sources=node_partitions,
    )  # fmt: skip
    # Step times (optional, keyed by job like the job events and window batches): a GPU's
    # window gets the mean step duration of its steps in that window before detection.
    step_times_name = topics["StepTime"].name
    jobs_handler = JobsHandler(
        stage3, job_meta, job_table, pending_table,
        job_events_topic=job_events_t.get_topic_name(), step_times_topic=step_times_name,
        retention_ms=cfg.allocation_retention_s * 1000, counters=counters,
        network=JobNetwork(settings.network, settings.detector), channels=job_partitions,
        hold_s=cfg.pending_hold_s,
    )  # fmt: skip
    batches_name = batches_t.get_topic_name()
    hold_commits(app.consumer, lambda topic, partition: (
        jobs_handler.commit_floor(partition) if topic == batches_name else None))  # fmt: skip
    # "batches": the fleet watch's verdicts, from its channel to the others (see handlers)
    out_topics = {"stragglers": stragglers_out, "findings": findings_t, "batches": batches_t}
    # Scored windows leave through librdkafka, flushed before each commit (see window_output).
    window_output = WindowOutput(settings.kafka, windows_out.get_topic_name())
    window_output.guard_commits(app.producer)

    def on_finding_sent(closed_ms: float | None) -> Any:
        def acked(_fut: Any) -> None:
            if closed_ms is not None:
                counters.latency(time.time() * 1000.0 - closed_ms)

        return acked

    @app.agent(app.topic(job_events_t.get_topic_name(), batches_t.get_topic_name(), step_times_name,
                         key_type=bytes, key_serializer="raw", value_serializer="raw"),
               name=f"{app_id}-jobs")  # fmt: skip
    async def jobs(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            # A window batch may wait in memory, its offset not committed (commit_floor).
            offset = msg.offset if msg.topic == batches_name else None
            try:
                outputs = jobs_handler.handle(msg.topic, msg.partition, event.key, event.value,
                                              offset=offset)  # fmt: skip
                for out in outputs:
                    if out.topic == "windows":
                        window_output.send(out.key, out.value)
                        continue
                    callback = (
                        on_finding_sent(out.closed_wall_ms) if out.topic == "stragglers" else None
                    )
                    await out_topics[out.topic].send(
                        key=out.key, value=out.value, partition=out.partition, callback=callback
                    )
            except RECORD_ERRORS as exc:
                await dead(event, "invalid", str(exc))

    # -- stage 4: the drain policy, keyed by node (the pure PolicyStage; see handlers) ----------
    # Recommendations carry the stream's HMAC when [signing] has a key (peerwatch.signing).
    signer = signer_of(settings.signing)
    policy_handler = PolicyHandler(
        PolicyStage(settings.policy), policy_table, findings_topic=findings_t.get_topic_name(),
        health_topic=health_t.get_topic_name(), counters=counters,
    )  # fmt: skip

    @app.agent(app.topic(findings_t.get_topic_name(), health_t.get_topic_name(), node_events_t.get_topic_name(),
                         key_type=bytes, key_serializer="raw", value_serializer="raw"),
               name=f"{app_id}-policy")  # fmt: skip
    async def policy_agent(stream: Any) -> None:
        async for event in stream.events():
            try:
                recs = policy_handler.handle(event.message.topic, event.key, event.value)
            except RECORD_ERRORS as exc:
                await dead(event, "invalid", str(exc))
                continue
            for key, value in recs:
                headers = signer.headers(key, value) if signer is not None else None
                await recs_out.send(key=key, value=value, headers=headers)

    # -- rebalances: stages 3 and 4 hold their tables' state in memory too; a partition that
    # comes back after another worker held it must be read from the tables again (see forget).
    stage3_topics = {job_events_t.get_topic_name(), batches_t.get_topic_name(), step_times_name}
    stage4_topics = {findings_t.get_topic_name(), health_t.get_topic_name(),
                     node_events_t.get_topic_name()}  # fmt: skip

    async def forget_on_revoke(_app: Any, revoked: set[Any], **_kw: Any) -> None:
        topics_revoked = {tp.topic for tp in revoked}
        if topics_revoked & stage3_topics:
            jobs_handler.forget()
        if topics_revoked & stage4_topics:
            policy_handler.forget()
        if revoked:
            log.info("%d partitions revoked: stages 3 and 4 read their tables again", len(revoked))

    app.on_partitions_revoked.connect(forget_on_revoke)  # type: ignore[arg-type]

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
