"""Counting wrappers around the SDK's exporters: what was exported, what failed and was dropped.

The OTLP exporters retry transient failures and then drop the batch; these wrappers make the
drops visible as numbers (see :mod:`peerwatch.exporters.otlp_sdk`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

log = logging.getLogger(__name__)


class CountingMetricExporter(MetricExporter):
    """Delegates to ``inner`` and counts exports and the points of failed ones."""

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self.inner = inner
        self.exports_ok = 0
        self.exports_failed = 0
        self.points_failed = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            log.exception("metric export raised")
            result = MetricExportResult.FAILURE
        if result is MetricExportResult.SUCCESS:
            self.exports_ok += 1
        else:
            self.exports_failed += 1
            self.points_failed += sum(
                len(m.data.data_points)
                for rm in metrics_data.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            )
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class CountingLogExporter(LogRecordExporter):
    """Delegates to ``inner`` and counts exported and failed log records."""

    def __init__(self, inner: LogRecordExporter) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0
        self._lock = threading.Lock()

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        try:
            result = self.inner.export(batch)
        except Exception:
            log.exception("log export raised")
            result = LogRecordExportResult.FAILURE
        with self._lock:
            if result is LogRecordExportResult.SUCCESS:
                self.exported += len(batch)
            else:
                self.failed += len(batch)
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()  # type: ignore[no-untyped-call]
