"""``peerwatch health prolog|epilog|periodic`` — node health checks with Nagios exit codes.

Thin wiring; the checks are ``peerwatch.producers.health``, the Slurm/Kafka choices (WARNING's
exit code, XID cursor, bounded publishing) are documented in ``peerwatch.producers.health_hook``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.producers.delivery import Delivery, DeliverySettings
from peerwatch.producers.health.infiniband import DEFAULT_SYSFS_ROOT
from peerwatch.producers.health.run import HealthDeps, HealthSettings, run_health
from peerwatch.producers.health_hook import (
    close_bounded,
    exit_code_for,
    new_xid_events,
    publish_outcome,
    save_cursor,
    slurm_context,
    summary_line,
)
from peerwatch.producers.nvml.device import NvmlApi, load_nvml
from peerwatch.producers.spool_lock import SpoolBusyError, SpoolLock
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings, expand
from peerwatch.topics import HEALTH

log = logging.getLogger(__name__)

#: Where the checks get NVML from. Tests replace it with a FakeNvml factory.
nvml_factory: Callable[[], NvmlApi] = load_nvml


def register(sub: Any) -> None:
    p = sub.add_parser(
        "health", help="node health checks for Slurm prolog/epilog or periodic runs (Nagios codes)"
    )
    p.add_argument("phase", choices=["prolog", "epilog", "periodic"])
    p.add_argument("--expected-gpus", type=int, help="GPUs this node must have (0: CPU node)")
    p.add_argument(
        "--dcgm-level", type=int, default=1, help="dcgmi diag level in the epilog (0: never run it)"
    )
    p.add_argument(
        "--dcgm-unavailable",
        choices=["ok", "warning", "unknown", "critical"],
        default="warning",
        help="status when dcgmi is installed but cannot run (host engine down, timeout); "
        "default warning: a monitor's missing tool must not drain the node",
    )
    p.add_argument("--xid-state", type=Path, help="the agent's XID state file (JSON lines)")
    p.add_argument(
        "--warn-exit-code",
        type=int,
        choices=[0, 1],
        help="exit code for WARNING (default: 0 in prolog/epilog so Slurm does not drain, 1 periodic)",
    )
    p.add_argument("--node", help="node name (default: $SLURMD_NODENAME, else short hostname)")
    p.add_argument("--ib-sysfs-root", type=Path, default=DEFAULT_SYSFS_ROOT)
    p.add_argument(
        "--ib-state",
        type=Path,
        help="keep the IB counters here between runs and judge their rates (periodic runs use "
        "<path>.periodic); without it no counter is judged",
    )
    p.add_argument(
        "--ib-expected-rate-gbps",
        type=float,
        help="a port below this rate is a WARNING (default: the highest rate it reported before)",
    )
    p.add_argument(
        "--kafka-timeout-s", type=float, default=5.0, help="bound on time spent publishing"
    )
    p.set_defaults(func=run)


def _open_delivery(
    kafka: KafkaSettings, spool_dir: Path, wait_s: float, timeout_s: float
) -> tuple[SpoolLock, Delivery] | None:
    lock = SpoolLock(spool_dir, timeout_s=wait_s)
    try:
        lock.acquire()
    except (SpoolBusyError, OSError) as exc:
        log.warning("health: %s", exc)
        return None
    settings = DeliverySettings(
        spool_dir=spool_dir, message_timeout_ms=int(timeout_s * 1000), retry_interval_s=0.5
    )
    return lock, Delivery(kafka, settings).start()


def ib_state_path(state: Path | None, phase: str) -> Path | None:
    """Prolog and epilog share the IB counter state (rates over each job and each idle spell);
    periodic runs keep their own beside it, so they never shorten a job's span."""
    if state is None or phase in ("PROLOG", "EPILOG"):
        return state
    return state.with_name(state.name + ".periodic")


def run(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    phase = args.phase.upper()
    ctx = slurm_context(phase, os.environ, args.node)
    spool_dir = expand(settings.spool_dir) / "health"
    # Started before the checks so that results spooled by earlier runs replay meanwhile.
    opened = _open_delivery(settings.kafka, spool_dir, 0.0, args.kafka_timeout_s)
    xids: list[dict[str, Any]] = []
    cursor: int | None = None
    if args.xid_state:
        xids, cursor = new_xid_events(args.xid_state, phase)
    health_settings = HealthSettings(
        expected_gpus=args.expected_gpus,
        ib_sysfs_root=args.ib_sysfs_root,
        ib_state=ib_state_path(args.ib_state, phase),
        ib_expected_rate_gbps=args.ib_expected_rate_gbps,
        dcgm_level=max(args.dcgm_level, 1),
        dcgm_phases=frozenset({"EPILOG"}) if args.dcgm_level > 0 else frozenset(),
        dcgm_unavailable_status=args.dcgm_unavailable.upper(),
    )
    result, _ = run_health(
        phase,
        node=ctx.node,
        settings=health_settings,
        xids=xids,
        job_id=ctx.job_id,
        deps=HealthDeps(nvml=nvml_factory()),
    )
    code = exit_code_for(result["status"], phase, args.warn_exit_code)
    result["exit_code"] = code
    if opened is None:  # another run held the spool; it should be done with it by now
        opened = _open_delivery(settings.kafka, spool_dir, 2.0, args.kafka_timeout_s)
    published = "skipped (spool busy)"
    if opened is not None:
        lock, delivery = opened
        value = AvroCodec("HealthCheckResult").encode(result)
        topic = settings.topic_prefix + HEALTH.name
        delivery.send(topic, ctx.node.encode(), value, ts_ms=result["ts_ms"])
        stats = close_bounded(delivery, args.kafka_timeout_s)
        published = publish_outcome(stats, delivery.spooled_records if stats else 0)
        lock.release()
    if args.xid_state and cursor is not None:
        save_cursor(args.xid_state, phase, cursor)
    print(summary_line(result, code, published), flush=True)
    return code
