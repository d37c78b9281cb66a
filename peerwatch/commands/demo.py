"""``peerwatch demo`` — a simulated fleet through real Kafka to drain recommendations.

Starts the local Kafka if none is configured, creates a fresh set of topics, runs the stream
worker (a real ``peerwatch stream`` process), publishes a simulated 64x8 fleet through the
producers' delivery path, and shows jobs, flagged GPUs with their evidence and recommendations as
they arrive. It ends with a summary of injected faults against findings. Ctrl-C cleans up.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.console import make_console

DEFAULT_SCENARIO = "demo.json"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="simulated fleet -> real Kafka -> stream -> recommendations")
    p.add_argument("--scenario", help="scenario file (default: the bundled demo.json)")
    p.add_argument("--duration", type=float, default=1500.0, help="simulated seconds (1500)")
    p.add_argument("--interval-s", type=float, default=2.0, help="sampling interval (2 s)")
    p.add_argument("--wall-s", type=float, default=110.0,
                   help="wall-clock seconds to spread the publishing over (110)")  # fmt: skip
    p.add_argument("--keep-topics", action="store_true", help="keep the demo's topics")
    p.add_argument("--no-view", action="store_true", help="print progress lines, no live view")
    p.set_defaults(func=run)


def _scenario_path(args: argparse.Namespace) -> str:
    if args.scenario:
        return str(args.scenario)
    return str(resources.files("peerwatch.producers.sim") / "scenarios" / DEFAULT_SCENARIO)


class _Consumer(threading.Thread):
    """Reads the demo's output topics, feeds the view, and archives what it read under
    ``archive`` (the archiver's layout, topics without the demo's prefix) so that ``peerwatch
    job JOBID --archive DIR`` works after the demo, when its topics (and Kafka) are gone."""

    def __init__(
        self, settings: Any, prefix: str, view: Any, lock: threading.Lock, archive: Path
    ) -> None:
        super().__init__(name="demo-consumer", daemon=True)
        from confluent_kafka import Consumer

        from peerwatch.io.archive.writer import AvroFileSink
        from peerwatch.kafka_config import consumer_config
        from peerwatch.topics import (
            JOB_EVENTS,
            JOB_WINDOWS,
            NIC_SAMPLES,
            RECOMMENDATIONS,
            STRAGGLERS,
        )

        self.consumer = Consumer(consumer_config(settings.kafka, f"{prefix}demo-view"))
        # The NIC samples are archived only (the network line of `peerwatch job` reads the
        # named ports' seconds down and error rates from them).
        specs = {"job": JOB_EVENTS, "finding": STRAGGLERS, "rec": RECOMMENDATIONS,
                 "window": JOB_WINDOWS, "nic": NIC_SAMPLES}  # fmt: skip
        self.topics = {prefix + spec.name: kind for kind, spec in specs.items()}
        self.archived = {kind: spec.name for kind, spec in specs.items()}
        self.archive = AvroFileSink(
            archive, {spec.name: str(spec.value_schema) for spec in specs.values()}
        )
        self.view, self.lock, self.stop = view, lock, threading.Event()
        self.last_output = time.monotonic()
        #: Why the thread ended early (the main loop stops the demo and says so); records the
        #: archive refused (a time no archive file is named by), skipped.
        self.error: str | None = None
        self.unarchived = 0

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.consumer.close()
            self.archive.close()

    def _run(self) -> None:
        from peerwatch.errors import CodecError
        from peerwatch.io.archive.layout import record_time_ms
        from peerwatch.schemas.codec import decode_any

        self.consumer.subscribe(list(self.topics))
        while not self.stop.is_set():
            for msg in self.consumer.consume(500, timeout=0.3):
                if msg.error():
                    continue
                kind = self.topics.get(msg.topic() or "")
                if kind is None:
                    continue
                value = msg.value()
                try:
                    _, record = decode_any(value or b"")
                except CodecError:
                    continue  # the stream dead-letters such records; the view just skips them
                ts_ms = record_time_ms(record)
                if ts_ms is not None:
                    try:
                        self.archive.write(self.archived[kind], record, ts_ms)
                    except ValueError:  # an event time no archive hour holds: as the archiver
                        self.unarchived += 1
                if kind == "nic":
                    continue
                if kind == "window":
                    with self.lock:
                        self.view.windows += 1
                    self.last_output = time.monotonic()
                    continue
                with self.lock:
                    if kind == "job":
                        self.view.on_job_event(record)
                    elif kind == "finding":
                        self.view.on_finding(record)
                    else:
                        self.view.on_recommendation(record)
                self.last_output = time.monotonic()


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from peerwatch.demo_view import DemoView
    from peerwatch.local.kafka import LocalKafka
    from peerwatch.producers.delivery import Delivery, DeliverySettings
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.publish import publish_to_kafka
    from peerwatch.producers.sim.scenario import load_scenario, with_fleet
    from peerwatch.settings import expand
    from peerwatch.streams.live.app import internal_topics
    from peerwatch.topic_admin import ensure_topics
    from peerwatch.topics import catalogue

    settings = settings_of(args)
    started_kafka: LocalKafka | None = None
    if not os.environ.get("PEERWATCH_KAFKA_BOOTSTRAP"):
        kafka = LocalKafka(expand(settings.cache_dir), expand(settings.state_dir))
        print("demo: starting the local Kafka (first run downloads it from Maven Central) ...")
        if kafka.start() == "started":
            started_kafka = kafka
        settings = replace(
            settings, kafka=replace(settings.kafka, bootstrap_servers=kafka.bootstrap)
        )
    prefix = f"demo{int(time.time())}."
    settings = replace(
        settings, topic_prefix=prefix, stream=replace(settings.stream, app_id="demo-stream")
    )
    ensure_topics(
        settings.kafka,
        [*catalogue(prefix, settings.stream.node_partitions), *internal_topics(settings)],
    )
    now_ms = int(time.time() * 1000)
    scenario = load_scenario(_scenario_path(args))
    interval_ms = int(args.interval_s * 1000)
    scenario = with_fleet(
        scenario,
        duration_s=args.duration,
        interval_s=args.interval_s,
        start_ms=now_ms - now_ms % interval_ms,
    )
    fleet = Fleet(scenario)
    node_records = fleet.spec.nodes * fleet.n_ticks
    rate = node_records / max(args.wall_s, 1.0)

    state = expand(settings.state_dir) / "demo"
    state.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PEERWATCH_KAFKA_BOOTSTRAP": settings.kafka.bootstrap_servers,
        "PEERWATCH_TOPIC_PREFIX": prefix,
    }
    log_path = state / f"{prefix}stream.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "peerwatch.cli",
             *(["--config", args.config] if args.config else []),
             "stream", "--app-id", "demo-stream", "--loglevel", "warning"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    view, lock = DemoView(), threading.Lock()
    archive = state / f"{prefix}archive"
    consumer = _Consumer(settings, prefix, view, lock, archive)
    consumer.start()
    delivery = Delivery(
        settings.kafka, DeliverySettings(spool_dir=state / f"{prefix}spool")
    ).start()
    stop = threading.Event()
    done = threading.Event()

    def on_tick(tick_ms: int, stats: Any) -> None:
        with lock:
            view.event_time_ms = tick_ms
            view.samples_published = stats.node_records

    def publish() -> None:
        try:
            publish_to_kafka(fleet, delivery, prefix, rate, stop, on_tick)
        finally:
            done.set()

    publisher = threading.Thread(target=publish, name="demo-publisher", daemon=True)
    print(
        f"demo: {fleet.spec.nodes} nodes x {fleet.spec.gpus_per_node} GPUs, "
        f"{args.duration:.0f} s of cluster time at {args.interval_s:g} s ticks "
        f"({node_records:,} node records) over ~{args.wall_s:.0f} s; topics {prefix}*"
    )
    publisher.start()
    interrupted = False
    tty = sys.stdout.isatty() and not args.no_view
    # The live view on the terminal's alternate screen, redrawn in place (no clear, no flicker);
    # the screen the user had comes back when the demo ends.
    from rich.live import Live

    live = Live(console=make_console(), screen=True, auto_refresh=False) if tty else None
    try:
        if live is not None:
            live.start()
        last_line = 0.0
        while True:
            time.sleep(1.0)
            if worker.poll() is not None:
                _leave(live)  # back to the normal screen, so the message stays
                print(f"demo: the stream worker exited ({worker.returncode}); log: {log_path}")
                break
            if not consumer.is_alive():
                _leave(live)  # back to the normal screen, so the message stays
                print(f"demo: the view's consumer stopped ({consumer.error}); stopping")
                break
            if live is not None:
                with lock:
                    live.update(view.renderable(), refresh=True)
            elif time.monotonic() - last_line > 10:
                last_line = time.monotonic()
                with lock:
                    print(
                        f"demo: published {view.samples_published:,} node records, "
                        f"{view.windows:,} GPU windows analysed, {len(view.flags)} GPUs flagged, "
                        f"{len(view.recommendations)} recommendations"
                    )
            # Finished when everything is published and the stream has been quiet for a while.
            if done.is_set() and time.monotonic() - consumer.last_output > 20:
                break
    except KeyboardInterrupt:
        interrupted = True
        _leave(live)  # back to the normal screen, so the message stays
        print("\ndemo: interrupted, cleaning up ...")
    finally:
        if live is not None:
            live.stop()
        stop.set()
        publisher.join(10)
        delivery.close(timeout_s=10)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)
        consumer.stop.set()
        consumer.join(5)
        if not args.keep_topics:
            _delete_topics(settings, prefix)
        if started_kafka is not None:
            started_kafka.stop()
    with lock:
        make_console().print(view.renderable())
        text, ok = view.summary(fleet.labels())
    print(text)
    flagged = sorted({f.job_id for f in view.flags.values() if not f.job_id.startswith("idle:")})
    jobs = flagged or sorted(view.jobs, key=lambda j: -int(view.jobs[j].get("gpus") or 0))
    if jobs:
        print(f"\nwhy was a job slow? the demo's outputs are archived in {archive}:\n"
              f"  peerwatch job {jobs[0]} --archive {archive}")  # fmt: skip
    if interrupted:
        return 130
    return 0 if ok else 1


def _delete_topics(settings: Any, prefix: str) -> None:
    from confluent_kafka.admin import AdminClient

    from peerwatch.kafka_config import admin_config

    admin = AdminClient(admin_config(settings.kafka))
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            try:
                future.result(30)
            except Exception as exc:  # cleanup is best effort; say what failed
                print(f"demo: could not delete a topic: {exc}", file=sys.stderr)


def _leave(live: Any) -> None:
    if live is not None:
        live.stop()
