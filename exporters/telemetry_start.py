"""Start a process's own OTLP metrics, importing the OpenTelemetry SDK only when they are on.

Kept apart from :mod:`.self_telemetry` so that the agent (``peerwatch[agent]``, no SDK installed)
can call it: with ``telemetry.endpoint`` empty nothing of the SDK is imported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from peerwatch.errors import ConfigError
from peerwatch.extras import missing_extra
from peerwatch.settings import TelemetrySettings

if TYPE_CHECKING:
    from peerwatch.exporters.self_telemetry import SelfTelemetry

log = logging.getLogger(__name__)


def start_self_telemetry(
    settings: TelemetrySettings, component: str, snapshot: Callable[[], Mapping[str, Any]]
) -> SelfTelemetry | None:
    """Export ``component``'s metrics to ``settings.endpoint``; None when it is empty (off).

    Raises ConfigError (``telemetry.endpoint``) when an endpoint is set and the SDK is not
    installed (the ``telemetry`` extra).
    """
    if not settings.endpoint:
        return None
    try:
        from peerwatch.exporters.otlp_sdk import otlp_metric_exporter
        from peerwatch.exporters.self_telemetry import SelfTelemetry
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc)
        if missing is None:
            raise
        raise ConfigError("telemetry.endpoint", f"is set, but {missing}") from exc
    exporter = otlp_metric_exporter(settings.endpoint, settings.protocol, settings.timeout_s)
    log.info("self telemetry: peerwatch-%s metrics to %s every %g s",
             component, settings.endpoint, settings.interval_s)  # fmt: skip
    return SelfTelemetry(settings, component, snapshot, metric_exporter=exporter)
