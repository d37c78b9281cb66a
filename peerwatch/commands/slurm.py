"""``peerwatch slurm prolog|epilog|flush-outbox|watch`` — Slurm hooks and the controller watcher.

The hooks run for every job on every node, so their import path is kept to the standard
library and the small pure modules: Kafka client, Avro and the watcher are imported only by
the subcommands that use them. Fastest start: ``python -m peerwatch.commands.slurm prolog``
(this module's own parser), which skips importing every other subcommand as the ``peerwatch``
console script does.

A hook stores its event in the outbox (a file, fsynced) and starts a detached sender that
delivers the outbox to Kafka, so the job never waits for Kafka, and exits 0 whatever happens.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("peerwatch.slurm")

HOOK_NAMES = ("prolog", "epilog")


def register(sub: Any) -> None:
    p = sub.add_parser("slurm", help="Slurm prolog/epilog hooks and the controller-side watcher")
    _add_subcommands(p)


def _add_subcommands(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="slurm_command", metavar="ACTION", required=True)
    for hook in HOOK_NAMES:
        h = actions.add_parser(hook, help=f"slurmd {hook.capitalize()}= hook (always exits 0)")
        h.add_argument("--node", help="node name when SLURMD_NODENAME is unset (default: host)")
        h.add_argument("--outbox", type=Path, help="outbox dir (default: <spool_dir>/slurm-hooks)")
        h.add_argument("--slurm-bin", type=Path, help="dir of scontrol (default: $PATH)")
        h.add_argument(
            "--no-scontrol", action="store_true",
            help="never ask `scontrol show job -d` for GPU indices missing from the environment",
        )  # fmt: skip
        h.add_argument("--scontrol-timeout-ms", type=int, default=150)
        h.add_argument(
            "--inline", action="store_true",
            help="deliver in this process instead of a detached sender (waits for Kafka)",
        )  # fmt: skip
        h.add_argument("--send-timeout-s", type=float, default=5.0)
        h.set_defaults(func=run_hook, hook=hook)
    f = actions.add_parser("flush-outbox", help="deliver the hooks' outbox to Kafka")
    f.add_argument("--outbox", type=Path, help="outbox dir (default: <spool_dir>/slurm-hooks)")
    f.add_argument("--timeout-s", type=float, default=5.0)
    f.set_defaults(func=run_flush)
    w = actions.add_parser("watch", help="poll squeue/sacct/sinfo and publish changes")
    w.add_argument("--slurm-bin", type=Path, help="dir of squeue, sacct, sinfo (default: $PATH)")
    w.add_argument("--interval-s", type=float, default=10.0)
    w.add_argument("--once", action="store_true", help="poll once and exit")
    w.add_argument("--dry-run", action="store_true", help="print events as JSON lines only")
    w.add_argument(
        "--state-file", type=Path, help="default: <state_dir>/slurm-watch.json"
    )  # fmt: skip
    w.add_argument("--command-timeout-s", type=float, default=30.0)
    w.set_defaults(func=run_watch)


def _settings(args: argparse.Namespace) -> Any:
    from peerwatch.settings import load_settings

    return load_settings(getattr(args, "config", None))


def _outbox_dir(args: argparse.Namespace, settings: Any) -> Path:
    from peerwatch.settings import expand

    return Path(args.outbox) if args.outbox else expand(settings.spool_dir) / "slurm-hooks"


# -- hooks ----------------------------------------------------------------------------------------
def run_hook(args: argparse.Namespace) -> int:
    """Publish this node's STARTED/ENDED event. Always returns 0: a failing Prolog drains the
    node and requeues the job, which monitoring must never cause."""
    try:
        _hook(args)
    except Exception as exc:
        print(f"peerwatch slurm {args.hook}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def _hook(args: argparse.Namespace) -> None:
    import socket

    from peerwatch.producers.slurm.hooks import gpu_indices_from_env, hook_event
    from peerwatch.producers.slurm.outbox import Outbox
    from peerwatch.settings import Settings
    from peerwatch.topics import JOB_EVENTS

    try:
        settings = _settings(args)
    except Exception as exc:
        print(f"peerwatch slurm {args.hook}: settings: {exc}", file=sys.stderr)
        settings = Settings()
    env = os.environ
    now_ms = int(time.time() * 1000)
    outbox = Outbox(_outbox_dir(args, settings))
    node = env.get("SLURMD_NODENAME") or args.node or socket.gethostname().split(".", 1)[0]
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    detail = None
    if job_id and gpu_indices_from_env(env) is None:
        detail = _remembered_gpus(args.hook, outbox.directory / "jobs", job_id, node)
        if detail is None and not args.no_scontrol:
            detail = _detail_gpus(args, job_id)
            if detail and args.hook == "prolog":
                _remember_gpus(outbox.directory / "jobs", job_id, detail.get(node, ()))
    record = hook_event(args.hook, env, now_ms, node=node, detail_gpus=detail)
    outbox.put(settings.topic_prefix + JOB_EVENTS.name, record["job_id"], "JobEvent", record)
    if args.inline:
        _send(settings, outbox, args.send_timeout_s)
    elif not outbox.sender_active():
        _spawn_sender(args, outbox.directory)


def _remember_gpus(directory: Path, job_id: str, indices: tuple[int, ...]) -> None:
    # The epilog cannot ask scontrol: a finished job's GRES detail is gone by then.
    directory.mkdir(parents=True, exist_ok=True)
    (directory / job_id).write_text(",".join(str(i) for i in indices))


def _remembered_gpus(
    hook: str, directory: Path, job_id: str, node: str
) -> dict[str, tuple[int, ...]] | None:
    """What this node's prolog learnt from scontrol; the epilog reads and removes it."""
    if hook != "epilog":
        return None
    path = directory / job_id
    try:
        text = path.read_text().strip()
        path.unlink()
    except OSError:
        return None
    return {node: tuple(int(i) for i in text.split(",") if i.strip().isdigit())}


def _detail_gpus(args: argparse.Namespace, job_id: str) -> dict[str, tuple[int, ...]] | None:
    from peerwatch.producers.slurm.client import CommandSlurmClient
    from peerwatch.producers.slurm.hooks import parse_job_detail_gpus

    client = CommandSlurmClient(args.slurm_bin, timeout_s=args.scontrol_timeout_ms / 1000)
    try:
        return parse_job_detail_gpus(client.job_detail(job_id))
    except Exception as exc:
        print(f"peerwatch slurm {args.hook}: no GPU indices: {exc}", file=sys.stderr)
        return None


def _spawn_sender(args: argparse.Namespace, outbox_dir: Path) -> None:
    import subprocess

    argv = [sys.executable, "-m", "peerwatch.commands.slurm"]
    if getattr(args, "config", None):
        argv += ["--config", str(args.config)]
    argv += ["flush-outbox", "--outbox", str(outbox_dir), "--timeout-s", str(args.send_timeout_s)]
    with open(outbox_dir / "sender.log", "ab") as err:
        # A new session and no inherited pipes: slurmd neither waits for nor kills the sender.
        subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True, close_fds=True,
        )  # fmt: skip


def _send(settings: Any, outbox: Any, timeout_s: float) -> Any:
    from confluent_kafka import Producer

    from peerwatch.kafka_config import producer_config
    from peerwatch.producers.slurm.hook_sender import send_outbox
    from peerwatch.schemas.codec import AvroCodec

    codecs: dict[str, AvroCodec] = {}

    def encode(schema: str, record: dict[str, Any]) -> bytes:
        if schema not in codecs:
            codecs[schema] = AvroCodec(schema)
        return codecs[schema].encode(record)

    timeout_ms = max(1000, int(timeout_s * 1000))
    config = producer_config(settings.kafka, **{"message.timeout.ms": timeout_ms})
    return send_outbox(outbox, lambda: Producer(config), encode, timeout_s)


def run_flush(args: argparse.Namespace) -> int:
    """Deliver the outbox; exit 0 when it is empty afterwards, 1 when records are left."""
    from peerwatch.producers.slurm.outbox import Outbox

    settings = _settings(args)
    result = _send(settings, Outbox(_outbox_dir(args, settings)), args.timeout_s)
    log.info(
        "outbox: delivered %d, left %d, bad %d%s", result.delivered, result.left, result.bad,
        " (another sender holds the lock)" if result.locked_out else "",
    )  # fmt: skip
    return 0 if result.left == 0 else 1


# -- watcher --------------------------------------------------------------------------------------
def run_watch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from peerwatch.producers.slurm.client import CommandSlurmClient
    from peerwatch.producers.slurm.watch_loop import (
        JsonLinesSink,
        KafkaSink,
        StateFile,
        WatchStats,
        topic_names,
    )
    from peerwatch.producers.slurm.watch_loop import (
        run_watch as loop,
    )
    from peerwatch.settings import expand

    settings = _settings(args)
    client = CommandSlurmClient(args.slurm_bin, timeout_s=args.command_timeout_s)
    topics = topic_names(settings.topic_prefix)
    state_file = StateFile(args.state_file or expand(settings.state_dir) / "slurm-watch.json")
    stop = threading.Event()
    stats = WatchStats()
    if not args.once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    if args.dry_run:
        sink: Any = JsonLinesSink(sys.stdout, topics)
        loop(client, sink, None, interval_s=args.interval_s, once=args.once, stop=stop,
             state=state_file.load(), stats=stats)  # fmt: skip
        logging.getLogger(__name__).info("watch: %s", stats)
        return 0
    from peerwatch.exporters.consume import deadletter_topic
    from peerwatch.producers.delivery import Delivery, DeliverySettings
    from peerwatch.schemas.codec import AvroCodec

    codecs = {name: AvroCodec(name) for name in topics}
    delivery = Delivery(
        settings.kafka,
        DeliverySettings(
            spool_dir=expand(settings.spool_dir) / "slurm-watch",
            deadletter_topic=deadletter_topic(settings.topic_prefix),
        ),
    ).start()
    try:
        sink = KafkaSink(delivery.send, lambda s, r: codecs[s].encode(r), topics)
        loop(client, sink, state_file, interval_s=args.interval_s, once=args.once, stop=stop,
             stats=stats)  # fmt: skip
    finally:
        delivery.close(10.0)
        logging.getLogger(__name__).info("watch: %s", stats)
    return 0


# -- fast entry point for hooks ---------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``python -m peerwatch.commands.slurm ACTION ...``: this module's subcommands only."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="peerwatch slurm")
    parser.add_argument("--config", help="TOML config file (default: $PEERWATCH_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true")
    _add_subcommands(parser)
    is_hook = any(a in HOOK_NAMES for a in argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # A typo in slurm.conf's Prolog= line must not fail every job on the node.
        return 0 if is_hook else int(exc.code or 0)
    from peerwatch.display import setup_logging

    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    from peerwatch.errors import PeerwatchError

    try:
        code: int = args.func(args)
    except PeerwatchError as exc:
        print(f"peerwatch slurm {args.slurm_command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
