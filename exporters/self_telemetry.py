"""The SDK edge of peerwatch's own metrics: a process's counters out over OTLP.

:class:`SelfTelemetry` registers one observable instrument per
:class:`~peerwatch.exporters.self_metrics.SelfMetric` of the process and reads the process's
snapshot (a callable returning a mapping) at every export, on the SDK's reader thread: the
counters stay where the process keeps them, one implementation. The resource is
``service.name=peerwatch-<component>`` and ``service.instance.id=<host>:<pid>`` (Prometheus:
``job`` and ``instance``). A collector that is down costs a failed export (retried by the SDK,
then dropped); the next export carries the current values again.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from peerwatch import __version__
from peerwatch.exporters.otlp_counting import CountingMetricExporter
from peerwatch.exporters.self_metrics import (
    COMPONENTS,
    SelfMetric,
    labelled_observations,
    observations,
)
from peerwatch.settings import TelemetrySettings

log = logging.getLogger(__name__)

SCOPE = "peerwatch.self"
Snapshot = Callable[[], Mapping[str, Any]]
#: A snapshot younger than this serves the instruments of the same collection.
REFRESH_S = 0.5


class SelfTelemetry:
    """Exports ``component``'s metrics (see :data:`~peerwatch.exporters.self_metrics.COMPONENTS`)
    read from ``snapshot()`` every ``settings.interval_s``. ``metric_exporter`` None: only the
    extra ``metric_readers`` (tests) read them."""

    def __init__(
        self,
        settings: TelemetrySettings,
        component: str,
        snapshot: Snapshot,
        *,
        metric_exporter: MetricExporter | None,
        metric_readers: Iterable[MetricReader] = (),
    ) -> None:
        self.specs: tuple[SelfMetric, ...] = COMPONENTS[component]
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._latest: dict[str, float] = {}
        self._labelled: dict[str, list[tuple[str, float]]] = {}
        self._taken_s = -math.inf
        self.snapshot_errors = 0
        readers = list(metric_readers)
        self.exporter: CountingMetricExporter | None = None
        if metric_exporter is not None:
            self.exporter = CountingMetricExporter(metric_exporter)
            readers.append(PeriodicExportingMetricReader(
                self.exporter, export_interval_millis=settings.interval_s * 1000,
                export_timeout_millis=settings.timeout_s * 1000 + 1000,
            ))  # fmt: skip
        resource = Resource.create({
            "service.name": f"peerwatch-{component}", "service.version": __version__,
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
        })  # fmt: skip
        self.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        meter = self.meter_provider.get_meter(SCOPE, __version__)
        for spec in self.specs:
            create = (
                meter.create_observable_counter
                if spec.kind == "counter"
                else meter.create_observable_gauge
            )
            create(spec.name, callbacks=[self._observer(spec.name, spec.label)],
                   unit=spec.unit, description=spec.description)  # fmt: skip

    def _observer(self, name: str, label: str = "") -> Any:
        def observe(_options: CallbackOptions) -> list[Observation]:
            # One snapshot serves every instrument of a collection (they run back to back).
            with self._lock:
                stale = time.monotonic() - self._taken_s > REFRESH_S
            if stale:
                self._refresh()
            with self._lock:
                value = self._latest.get(name)
                series = self._labelled.get(name, [])
            if label:
                return [Observation(v, {label: key}) for key, v in series]
            return [] if value is None else [Observation(value)]

        return observe

    def _refresh(self) -> None:
        try:
            snapshot = self._snapshot()
            latest = observations(self.specs, snapshot)
            labelled = labelled_observations(self.specs, snapshot)
        except Exception:  # a snapshot must never kill the SDK's reader thread
            self.snapshot_errors += 1
            log.exception("self telemetry: snapshot failed")
            return
        with self._lock:
            self._latest, self._labelled = latest, labelled
            self._taken_s = time.monotonic()

    def close(self) -> None:
        """A last export, then shut down (idempotent through the SDK)."""
        self.meter_provider.shutdown()
