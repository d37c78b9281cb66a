"""``peerwatch job JOBID [--archive DIR]`` — why was my job slow? The job's GPUs against their
peers, its flagged GPUs with cause and evidence, and a one-line verdict; from Kafka (default) or
an archive directory. An archive that holds only the pipeline's inputs (``peerwatch simulate
--archive``) is replayed for that job first, as ``peerwatch replay --job`` would.
``--json`` prints the summary as JSON, ``--html FILE`` writes the job's report page;
``--admin-comment`` stores the verdict in the job's Slurm AdminComment."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.errors import ConfigError, ServiceError
from peerwatch.output_paths import check_output_file, write_output


def register(sub: Any) -> None:
    p = sub.add_parser("job", help="one job's GPUs against their peers, and a verdict")
    p.add_argument("job_id", metavar="JOBID", help="Slurm job id")
    p.add_argument("--archive", metavar="DIR",
                   help="read an archive directory instead of Kafka (inputs only: replayed)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--html", metavar="FILE", help="also write the job's report page (HTML)")
    p.add_argument("--all", action="store_true", help="every GPU in the table")
    p.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="colours: auto = on a terminal unless NO_COLOR is set")  # fmt: skip
    p.add_argument("--no-replay", action="store_true",
                   help="never replay an archive's samples, only read its outputs")  # fmt: skip
    p.add_argument("--admin-comment", action="store_true",
                   help="store the verdict in the job's Slurm AdminComment (scontrol update; "
                        "for an EpilogSlurmctld hook)")  # fmt: skip
    p.add_argument("--slurm-bin", default="", help="folder of scontrol (default: PATH)")
    p.add_argument("--quiet", action="store_true", help="print nothing (hooks)")
    p.set_defaults(func=run)


def _replayed(args: argparse.Namespace, records: Any) -> Any:
    """The archive's samples of the job through the pipeline (``peerwatch replay --job``)."""
    from peerwatch.cli import build_parser
    from peerwatch.commands.replay import replay_from_args

    argv = ["--config", args.config] if args.config else []
    argv += ["replay", "--archive", args.archive, "--job", args.job_id]
    if args.quiet:  # elsewhere the bar shows on a terminal only (peerwatch.console)
        argv.append("--no-progress")
    replay_args = build_parser("replay").parse_args(argv)
    result, _, _ = replay_from_args(replay_args, keep_windows=True)
    records.windows = result.windows
    records.findings = result.findings
    records.recommendations = result.recommendations
    records.node_events = [e for s, e in result.events if s == "node-events"]
    return records


def load(args: argparse.Namespace) -> Any:
    """The job's records from the source the options name. Raises ConfigError, ServiceError."""
    from peerwatch.streams.offline.job_records import (
        archive_has_samples,
        archive_job_records,
        check_archive_prefix,
        kafka_job_records,
    )

    settings = settings_of(args)
    if args.archive:
        root = Path(args.archive)
        if not root.is_dir():
            raise ConfigError("--archive", f"{args.archive} is not a directory")
        check_archive_prefix(root, settings.topic_prefix)
        records = archive_job_records(root, args.job_id, settings.topic_prefix)
        if (
            not records.windows
            and records.knows(args.job_id)  # its events say which GPUs were its own
            and not args.no_replay
            and archive_has_samples(root, settings.topic_prefix)
        ):
            print(
                f"job: {args.archive} holds no GPU windows of job {args.job_id}; "
                "replaying its samples ...",
                file=sys.stderr,
            )
            records = _replayed(args, records)
        return records
    from confluent_kafka import KafkaException

    try:
        return kafka_job_records(settings.kafka, args.job_id, settings.topic_prefix)
    except KafkaException as exc:
        raise ServiceError(f"cannot read the job's records from Kafka: {exc}") from exc


#: Exit status of ``peerwatch job`` for a job it finds no record of.
EXIT_UNKNOWN_JOB = 1


def unknown_job(args: argparse.Namespace) -> str:
    """What to say of a job with no event, window or finding where it was looked for."""
    from peerwatch.topics import JOB_EVENTS, JOB_WINDOWS

    if args.archive:
        return (
            f"job {args.job_id} is unknown: {args.archive} holds no event, window or finding of it"
        )
    days = {t.name: t.retention_ms / 86_400_000 for t in (JOB_WINDOWS, JOB_EVENTS)}
    return (
        f"job {args.job_id} is unknown: Kafka holds no event, window or finding of it. Kafka "
        f"keeps GPU windows {days[JOB_WINDOWS.name]:g} days and job events "
        f"{days[JOB_EVENTS.name]:g} days (topic retention); an older job is read from the "
        "archive: peerwatch job JOBID --archive DIR"
    )


def run(args: argparse.Namespace) -> int:
    from peerwatch.report.job_summary import summarize_job

    if args.admin_comment:
        from peerwatch.producers.slurm.job_comment import JOB_ID

        if not JOB_ID.fullmatch(args.job_id):
            raise ConfigError("JOBID", f"{args.job_id!r} is not a plain Slurm job id")
    html = check_output_file(args.html, "--html") if args.html else None  # before the work
    records = load(args)
    # The epilog hook (--admin-comment) still writes its comment for a job with no record (a
    # CPU job, say): "no GPU windows or findings found", and does not fail for it.
    if not records.knows(args.job_id) and not args.admin_comment:
        if not args.quiet:
            print(f"peerwatch job: {unknown_job(args)}", file=sys.stderr)
        return EXIT_UNKNOWN_JOB
    summary = summarize_job(
        args.job_id, records.windows, records.findings, records.recommendations,
        records.job_events, records.node_events, records.actions,
        z_threshold=settings_of(args).detector.z_threshold, nic_ports=records.nic_ports,
    )  # fmt: skip
    if records.undecodable:
        summary.skipped["undecodable"] = records.undecodable
    if html is not None:
        from peerwatch.exporters.report import render_job_report

        events = [("job-events", e) for e in records.job_events]
        events += [("node-events", e) for e in records.node_events]
        page = render_job_report(summary, records.windows, records.findings,
                                 summary.recommendations, events)  # fmt: skip
        write_output(html, page, "--html")
    if args.admin_comment:
        from peerwatch.producers.slurm.command import SlurmCommands
        from peerwatch.producers.slurm.job_comment import set_admin_comment

        set_admin_comment(SlurmCommands(args.slurm_bin or None), args.job_id, summary.verdict)
    if args.quiet:
        return 0
    if args.json:
        print(json.dumps(summary.to_json(), sort_keys=True))
    else:
        from rich.console import Group

        from peerwatch.console import make_console, wants_colour
        from peerwatch.job_view import renderables

        console = make_console(colour=wants_colour(args.color))
        console.print(Group(*renderables(summary, all_gpus=args.all)))
    return 0
