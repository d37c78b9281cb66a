"""``peerwatch agent`` — the per-node GPU agent: NVML samples to Kafka every interval.

Thin wiring only; the loop is ``peerwatch.producers.agent.NodeAgent``. Without NVML (no driver)
the agent exits 2 with the reason, unless ``--allow-no-gpu``: then it publishes records with an
empty ``gpus`` array so a CPU node still heartbeats.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pynvml

from peerwatch.clock import SystemClock
from peerwatch.commands import settings_of
from peerwatch.producers.agent import (
    JsonLinesSink,
    NodeAgent,
    NoGpuSampler,
    TickChannel,
    new_run_id,
)
from peerwatch.producers.delivery import Delivery, DeliverySettings
from peerwatch.producers.health.run import append_xid_event
from peerwatch.producers.health_hook import short_hostname
from peerwatch.producers.nic.ports import discover_ports
from peerwatch.producers.nic.sampler import NicSampler
from peerwatch.producers.nic.sysfs import Reader, SysfsTree
from peerwatch.producers.nvml.device import NvmlApi, NvmlUnavailableError, init_nvml, load_nvml
from peerwatch.producers.nvml.sampler import GpuSampler
from peerwatch.producers.nvml.xid import XidCallback, XidWatcher
from peerwatch.producers.spool_lock import SpoolLock
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import AgentSettings, expand
from peerwatch.topics import NIC_SAMPLES, SAMPLES

log = logging.getLogger(__name__)

#: Where the agent gets NVML from. Tests replace it with a FakeNvml factory.
nvml_factory: Callable[[], NvmlApi] = load_nvml


def register(sub: Any) -> None:
    p = sub.add_parser("agent", help="sample this node's GPUs (NVML) and publish to Kafka")
    p.add_argument("--interval-s", type=float, help="sampling interval (agent.interval_s)")
    p.add_argument("--node", help="node name (default: short hostname)")
    p.add_argument("--count", type=int, help="stop after N regular ticks (tests, smoke runs)")
    p.add_argument("--dry-run", action="store_true", help="print decoded records as JSON lines")
    p.add_argument(
        "--allow-no-gpu",
        action="store_true",
        default=None,
        help="without NVML, publish records with no GPUs instead of exiting 2 (agent.allow_no_gpu)",
    )
    p.add_argument(
        "--xid-state",
        help="also append each XID to this JSON-lines file (agent.xid_state; read by "
        "`peerwatch health --xid-state`)",
    )
    p.add_argument(
        "--sysfs-root", help="read the NIC ports from this sysfs tree (agent.sysfs_root)"
    )
    p.set_defaults(func=run)


@contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop`` while inside; handlers are restored after. Outside the
    main thread (where Python cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def agent_snapshot(agent: NodeAgent, delivery: Delivery | None) -> dict[str, Any]:
    """The agent's counters for its own telemetry (see peerwatch.exporters.self_metrics.AGENT)."""
    out: dict[str, Any] = {**dataclasses.asdict(agent.stats),
                           "cpu_s": agent.stats.cpu_ms_total / 1000.0,
                           "nic_cpu_s": agent.stats.nic_cpu_ms_total / 1000.0}  # fmt: skip
    if delivery is not None:
        out.update(dataclasses.asdict(delivery.stats))
        out["spool_depth"] = delivery.spooled_records
        out["breaker_open"] = delivery.spooling
    return out


def nic_channel(
    cfg: AgentSettings,
    *,
    node: str,
    interval_ms: int,
    clock: SystemClock,
    run_id: str,
    gpu_bus_ids: dict[int, str],
    topic: str,
) -> tuple[TickChannel, AvroCodec]:
    """The NIC sampler of ``cfg`` (``agent.sysfs_root``, ``agent.nic_ports``) as a tick channel
    publishing NodeNicSample records to ``topic``, and its codec."""
    reader = Reader(SysfsTree(cfg.sysfs_root))
    ports = discover_ports(reader, gpu_bus_ids, cfg.nic_ports)
    log.info("agent: NIC ports %s (rails %s)", [p.name for p in ports] or "none",
             {p.name: list(p.gpu_indices) for p in ports})  # fmt: skip
    sampler = NicSampler(
        reader, ports, node=node, interval_ms=interval_ms, clock=clock, agent_run_id=run_id
    )
    codec = AvroCodec("NodeNicSample")
    return TickChannel(sampler.sample, codec.encode, topic), codec


def run(args: argparse.Namespace) -> int:
    settings = settings_of(args, {"agent.interval_s": args.interval_s,
                                  "agent.allow_no_gpu": args.allow_no_gpu,
                                  "agent.xid_state": args.xid_state and str(args.xid_state),
                                  "agent.sysfs_root": args.sysfs_root})  # fmt: skip
    cfg = settings.agent
    interval_ms = round(cfg.interval_s * 1000)
    node = args.node or short_hostname()
    clock = SystemClock()
    run_id = new_run_id()
    nvml: NvmlApi | None = nvml_factory()
    gpu_bus_ids: dict[int, str] = {}
    sampler: GpuSampler | NoGpuSampler
    watcher_factory: Callable[[XidCallback], XidWatcher] | None = None
    try:
        assert nvml is not None
        init_nvml(nvml)
    except NvmlUnavailableError as exc:
        if not cfg.allow_no_gpu:
            print(f"peerwatch agent: {exc} (use --allow-no-gpu on a CPU node)", file=sys.stderr)
            return 2
        log.warning("agent: %s; publishing records without GPUs (--allow-no-gpu)", exc)
        nvml = None
        sampler = NoGpuSampler(node, interval_ms, clock, run_id)
    else:
        gpu_sampler = GpuSampler(
            nvml, node, interval_ms, clock, agent_run_id=run_id,
            energy_interval_ms=round(cfg.energy_interval_s * 1000),
        )  # fmt: skip
        # Probe now so that the first tick is not late by the probing time.
        probes = gpu_sampler.probe()
        log.info("agent: %d GPUs on %s", len(probes), node)
        gpu_bus_ids = {p.index: p.pci_bus_id for p in probes if p.pci_bus_id}
        sampler = gpu_sampler
        nvml_now = nvml
        watcher_factory = lambda cb: XidWatcher(nvml_now, cb, clock)  # noqa: E731

    codec = AvroCodec("NodeGpuSample")
    channel: TickChannel | None = None
    by_topic = {}
    if cfg.nic:
        channel, nic_codec = nic_channel(
            cfg, node=node, interval_ms=interval_ms, clock=clock, run_id=run_id,
            gpu_bus_ids=gpu_bus_ids, topic=settings.topic_prefix + NIC_SAMPLES.name,
        )  # fmt: skip
        by_topic[channel.topic] = nic_codec.decode
    lock: SpoolLock | None = None
    delivery: Delivery | None = None
    if args.dry_run:
        sink: Delivery | JsonLinesSink = JsonLinesSink(codec.decode, sys.stdout, by_topic)
    else:
        delivery_settings = DeliverySettings.of(settings, "agent")
        lock = SpoolLock(delivery_settings.spool_dir)
        lock.acquire()
        delivery = Delivery(settings.kafka, delivery_settings).start()
        sink = delivery
    listeners: list[XidCallback] = []
    if cfg.xid_state:
        xid_state = expand(cfg.xid_state)
        xid_state.parent.mkdir(parents=True, exist_ok=True)
        listeners.append(functools.partial(append_xid_event, xid_state))
    agent = NodeAgent(
        sampler=sampler,
        sink=sink,
        encode=codec.encode,
        topic=settings.topic_prefix + SAMPLES.name,
        node=node,
        interval_ms=interval_ms,
        clock=clock,
        watcher_factory=watcher_factory,
        xid_listeners=listeners,
        channel=channel,
    )
    log.info("agent: run %s, every %d ms to %s", run_id, interval_ms, agent.topic)
    from peerwatch.exporters.telemetry_start import start_self_telemetry

    telemetry = start_self_telemetry(
        settings.telemetry, "agent", functools.partial(agent_snapshot, agent, delivery)
    )
    try:
        with stop_on_signals(agent.stop):
            agent.run(args.count)
    finally:
        if telemetry is not None:
            telemetry.close()
        if delivery is not None:
            stats = delivery.close()
            log.info("agent: delivery %s; %d records in the spool", stats, delivery.spooled_records)
        if lock is not None:
            lock.release()
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)
    return 0
