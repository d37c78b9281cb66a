"""OpenTelemetry SDK wiring of the OTLP exporter: the thin edge around :mod:`.otlp` and :mod:`.series`.

Metrics: one observable instrument per :data:`~peerwatch.exporters.otlp.METRICS` entry (gauges,
and cumulative observable counters for ``hw.energy`` and ``hw.errors``), fed from a bounded
:class:`~peerwatch.exporters.series.SeriesStore`; a ``PeriodicExportingMetricReader`` exports
every ``interval_s``. Events: a ``LoggerProvider`` with a ``BatchLogRecordProcessor``.

When the collector is down (documented behaviour, SDK 1.45):

* the OTLP exporters retry a failed export with exponential backoff (1 s, 2 s, 4 s ... with
  jitter, at most 6 tries) for transient errors (gRPC UNAVAILABLE etc., HTTP 429/502/503/504)
  until ``timeout_s`` runs out, then give up: that batch is dropped. Counted here as
  ``metric_points_failed`` / ``events_failed``.
* metrics hold no backlog: every collection reads the latest values again, so after an outage
  the collector gets current values, not the missed history. Memory is the series store,
  bounded by ``max_series``.
* events wait in the batch processor's queue, at most ``max_queued_events``; when full the SDK
  drops the oldest. After :meth:`OtlpSink.close` the exact number is
  ``events_dropped_queue_full`` (emitted - exported - failed).

NodeNicSamples become per-port metrics (:mod:`.otlp_nic`: spans of ``interval_s``, a second
:class:`~peerwatch.exporters.series.SeriesStore` keyed by node and port, as bounded).

Findings and recommendations are also counted (``peerwatch.findings``,
``peerwatch.recommendations``: each id once, see :class:`~peerwatch.exporters.series.EventCounts`).

Own telemetry goes out with the data: ``peerwatch.exporter.series.active``,
``peerwatch.exporter.port_series.active`` and ``peerwatch.exporter.discarded`` (attribute
``reason``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from peerwatch import __version__
from peerwatch.clock import SYSTEM_CLOCK, Clock
from peerwatch.exporters.base import ExportError
from peerwatch.exporters.otlp import (
    EVENT_COUNTERS,
    METRICS,
    event_count,
    event_for,
    series_key,
    window_points,
)
from peerwatch.exporters.otlp_counting import CountingLogExporter, CountingMetricExporter
from peerwatch.exporters.otlp_nic import NIC_METRICS, span_points
from peerwatch.exporters.series import EventCounts, SeriesStore
from peerwatch.producers.nic.spans import PortSpans
from peerwatch.settings import ExportSettings
from peerwatch.streams.core.settings import NetworkSettings

log = logging.getLogger(__name__)

SCOPE = "peerwatch.exporters.otlp"


def signal_url(endpoint: str, signal: Literal["metrics", "logs"]) -> str:
    """The OTLP/HTTP URL of ``signal`` for a base endpoint (``.../v1/metrics``)."""
    base = endpoint.rstrip("/")
    return base if base.endswith(f"/v1/{signal}") else f"{base}/v1/{signal}"


def otlp_metric_exporter(endpoint: str, protocol: str, timeout_s: float) -> MetricExporter:
    """The SDK's OTLP metric exporter (no connection is made here)."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        insecure = endpoint.startswith("http://")
        return OTLPMetricExporter(endpoint=endpoint, insecure=insecure, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter(endpoint=signal_url(endpoint, "metrics"), timeout=timeout_s)


def otlp_exporters(config: ExportSettings) -> tuple[MetricExporter, LogRecordExporter]:
    """The SDK's OTLP metric and log exporters for ``config`` (no connection is made here)."""
    metrics = otlp_metric_exporter(config.endpoint, config.protocol, config.timeout_s)
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        insecure = config.endpoint.startswith("http://")
        return metrics, OTLPLogExporter(
            endpoint=config.endpoint, insecure=insecure, timeout=config.timeout_s
        )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )

    return metrics, HttpLogExporter(
        endpoint=signal_url(config.endpoint, "logs"), timeout=config.timeout_s
    )


class OtlpSink:
    """A :class:`~peerwatch.exporters.base.Sink` publishing GpuWindows as OTLP metrics and
    findings, recommendations, health results and drain actions as OTLP events.

    ``metric_exporter`` is wrapped in a counting exporter and read every ``config.interval_s``;
    ``metric_readers`` are extra readers (``InMemoryMetricReader`` in tests). ``network``: the
    ``[network]`` settings the port metrics read (rated speed, sampling gaps, xmit_wait bytes
    per tick). Nothing connects before the first export.
    """

    def __init__(
        self,
        config: ExportSettings,
        *,
        metric_exporter: MetricExporter | None,
        log_exporter: LogRecordExporter,
        metric_readers: Iterable[MetricReader] = (),
        clock: Clock = SYSTEM_CLOCK,
        resource_attributes: Mapping[str, str] | None = None,
        network: NetworkSettings | None = None,
    ) -> None:
        self.config = config
        self.store = SeriesStore(
            max_series=config.max_series, stale_after_s=config.stale_after_s, clock=clock
        )
        self.network = network or NetworkSettings()
        self.ports = PortSpans(span_s=config.interval_s, network=self.network,
                               max_ports=config.max_series, stale_after_s=config.stale_after_s,
                               clock=clock)  # fmt: skip
        self.port_store = SeriesStore(
            max_series=config.max_series, stale_after_s=config.stale_after_s, clock=clock
        )
        self.event_counts = EventCounts(
            max_series=config.max_series, linger_s=config.stale_after_s, clock=clock
        )
        own: dict[str, str] = {"service.name": "peerwatch", "service.version": __version__}
        if "service.instance.id" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
            # Stable across restarts (the SDK's default is a random id): Prometheus's
            # ``instance`` label is part of every series, so a new one would re-create them all.
            own["service.instance.id"] = socket.gethostname()
        resource = Resource.create({**own, **(resource_attributes or {})})
        readers = list(metric_readers)
        self._metric_exporter = None
        if metric_exporter is not None:
            self._metric_exporter = CountingMetricExporter(metric_exporter)
            readers.append(
                PeriodicExportingMetricReader(
                    self._metric_exporter,
                    export_interval_millis=config.interval_s * 1000,
                    export_timeout_millis=config.timeout_s * 1000 + 1000,
                )
            )
        self.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        self._log_exporter = CountingLogExporter(log_exporter)
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(
                self._log_exporter,
                schedule_delay_millis=config.event_delay_s * 1000,
                max_export_batch_size=config.event_batch_size,
                export_timeout_millis=config.timeout_s * 1000,
                max_queue_size=config.max_queued_events,
            )
        )
        self._logger = self.logger_provider.get_logger(SCOPE, __version__)
        self.events_emitted = 0
        #: Exact once closed: events the full queue dropped (emitted - exported - failed).
        self.events_dropped_queue_full = 0
        self._closed = False
        self._register_instruments()

    def _register_instruments(self) -> None:
        meter = self.meter_provider.get_meter(SCOPE, __version__)
        for store, specs in ((self.store, METRICS), (self.port_store, NIC_METRICS)):
            for spec in specs:
                create = (
                    meter.create_observable_counter
                    if spec.kind == "counter"
                    else meter.create_observable_gauge
                )
                create(spec.name, callbacks=[self._observer(store, spec.name)], unit=spec.unit,
                       description=spec.description)  # fmt: skip
        for spec in EVENT_COUNTERS:
            meter.create_observable_counter(
                spec.name, callbacks=[self._event_observer(spec.name)], unit=spec.unit,
                description=spec.description,
            )  # fmt: skip
        meter.create_observable_gauge(
            "peerwatch.exporter.series.active",
            callbacks=[lambda _o: [Observation(len(self.store))]],
            unit="{series}",
            description="GPU-in-job series currently exported.",
        )
        meter.create_observable_gauge(
            "peerwatch.exporter.port_series.active",
            callbacks=[lambda _o: [Observation(len(self.port_store))]],
            unit="{series}",
            description="Node-port series (NIC metrics) currently exported.",
        )
        meter.create_observable_counter(
            "peerwatch.exporter.discarded",
            callbacks=[self._discarded],
            unit="{item}",
            description="Series, windows, points and events the exporter let go, by reason.",
        )

    @staticmethod
    def _observer(store: SeriesStore, name: str) -> Any:
        def observe(_options: CallbackOptions) -> list[Observation]:
            return [Observation(value, dict(attrs)) for value, attrs in store.observe(name)]

        return observe

    def _event_observer(self, name: str) -> Any:
        def observe(_options: CallbackOptions) -> list[Observation]:
            return [Observation(n, dict(attrs)) for n, attrs in self.event_counts.observe(name)]

        return observe

    def _discarded(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"reason": reason}) for reason, n in self.discarded().items()]

    def discarded(self) -> dict[str, int]:
        """What was let go so far, by reason (series evictions, failed exports, ...)."""
        s, p, n = self.store.stats, self.port_store.stats, self.ports.stats
        return {
            "series_ended": s.series_evicted_ended,
            "series_stale": s.series_evicted_stale,
            "series_cap": s.series_dropped_cap,
            "window_out_of_order": s.windows_out_of_order,
            "window_of_ended_job": s.windows_of_ended_jobs,
            "port_series_stale": p.series_evicted_stale,
            "port_series_cap": p.series_dropped_cap,
            "port_reading_out_of_order": n.readings_out_of_order,
            "port_state_cap": n.ports_dropped_cap,
            "port_state_stale": n.ports_evicted_stale,
            "event_count_duplicate": self.event_counts.duplicates,
            "event_series_cap": self.event_counts.series_dropped_cap,
            "metric_export_failed": self._metric_exporter.points_failed
            if self._metric_exporter
            else 0,
            "event_export_failed": self._log_exporter.failed,
        }

    def stats(self) -> dict[str, int]:
        """Every counter of the sink: :meth:`discarded` plus live series and event counts."""
        return {
            **self.discarded(),
            "series_active": len(self.store),
            "windows_applied": self.store.stats.windows_applied,
            "port_series_active": len(self.port_store),
            "port_readings": self.ports.stats.readings,
            "port_spans": self.ports.stats.spans_closed,
            "port_counter_resets": self.ports.stats.counter_resets,
            "port_counter_saturations": self.ports.stats.counter_saturations,
            "events_emitted": self.events_emitted,
            "events_exported": self._log_exporter.exported,
            "events_dropped_queue_full": self.events_dropped_queue_full,
            "metric_exports_ok": self._metric_exporter.exports_ok if self._metric_exporter else 0,
            "metric_exports_failed": self._metric_exporter.exports_failed
            if self._metric_exporter
            else 0,
        }

    def write(self, schema_name: str, record: Mapping[str, Any]) -> None:
        """Map one decoded record; other schemas are ignored.

        Raises ExportError when the record lacks a field the mapping needs.
        """
        try:
            if schema_name == "GpuWindow":
                self.store.apply_window(
                    series_key(record), int(record["window_start_ms"]), window_points(record)
                )
            elif schema_name == "NodeNicSample":
                for closed in self.ports.add_sample(record):
                    self.port_store.apply_window(
                        closed.key, closed.window.start_ms, span_points(closed, self.network)
                    )
            elif schema_name == "JobEvent":
                self._job_event(record)
            else:
                counted = event_count(schema_name, record)
                if counted is not None:
                    self.event_counts.count(counted)
                event = event_for(schema_name, record)
                if event is not None:
                    self._logger.emit(
                        timestamp=event.timestamp_ms * 1_000_000,
                        severity_number=event.severity_number,
                        severity_text=event.severity_text,
                        body=event.body,
                        attributes=event.attributes,
                        event_name=event.event_name,
                    )
                    self.events_emitted += 1
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportError(
                f"{schema_name}: cannot map record ({type(exc).__name__}: {exc})"
            ) from exc

    def _job_event(self, event: Mapping[str, Any]) -> None:
        kind, job_id = event["kind"], str(event["job_id"])
        if kind == "ENDED":
            self.store.job_ended(job_id)
            self.event_counts.job_ended(job_id)
        elif kind == "REQUEUED":
            # The next run keeps the job id: drop this run's series, accept the next one's.
            self.store.job_ended(job_id)
            self.store.job_started(job_id)
            self.event_counts.job_started(job_id)
        elif kind == "STARTED":
            self.store.job_started(job_id)
            self.event_counts.job_started(job_id)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export pending events and collect+export metrics now.

        True when both finished within ``timeout_s`` and no export failed meanwhile (the SDK's
        own ``force_flush`` reports True even when the batch was dropped).
        """
        timeout_ms = int(timeout_s * 1000)
        failures = self._failures()
        events_ok = self.logger_provider.force_flush(timeout_ms)
        metrics_ok = self.meter_provider.force_flush(timeout_ms)
        return bool(events_ok and metrics_ok) and self._failures() == failures

    def _failures(self) -> tuple[int, int]:
        metric_failures = self._metric_exporter.exports_failed if self._metric_exporter else 0
        return (metric_failures, self._log_exporter.failed)

    def close(self) -> None:
        """Flush and shut the providers down (a last metric export included). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()
        lost = self.events_emitted - self._log_exporter.exported - self._log_exporter.failed
        if lost:
            log.warning("%d events dropped: the event queue was full", lost)
        self.events_dropped_queue_full = max(lost, 0)


def otlp_sink(
    config: ExportSettings,
    *,
    clock: Clock = SYSTEM_CLOCK,
    resource_attributes: Mapping[str, str] | None = None,
    network: NetworkSettings | None = None,
) -> OtlpSink:
    """An :class:`OtlpSink` exporting to the collector at ``config.endpoint``.

    ``resource_attributes`` add to ``service.name=peerwatch`` (``OTEL_RESOURCE_ATTRIBUTES`` is
    honoured too). ``config`` validated itself when it was built.
    """
    metric_exporter, log_exporter = otlp_exporters(config)
    return OtlpSink(
        config,
        metric_exporter=metric_exporter,
        log_exporter=log_exporter,
        clock=clock,
        resource_attributes=resource_attributes,
        network=network,
    )
