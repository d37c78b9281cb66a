"""A simulated fleet through the real pipeline into a real Prometheus, queried with PromQL.

Simulated samples on real Kafka -> a ``peerwatch stream`` worker (subprocess) -> GpuWindow,
StragglerFinding and DrainRecommendation records -> the OTLP export loop -> the real
OpenTelemetry Collector (prometheus exporter) -> Debian's Prometheus, scraping every second.
The stream worker and a ``peerwatch agent`` (``--allow-no-gpu``) export their own metrics
through the same collector (``[telemetry]``). Expected values come from the records on Kafka
and the worker's counters file, never from constants.

Scenario: 8 nodes x 8 GPUs and 2 NIC ports each, 10 s windows; job 3001 (32 GPUs) has an 8%
SM-clock drop on gpu00001/5; job 3002 (32 GPUs) gets a symbol-error burst on gpu00007's port
mlx5_1/1 and an XID 79 on gpu00006/2 (a hard recommendation). The NIC samples go through the
OTLP exporter as per-port metrics.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from peerwatch.exporters.consume import kafka_export_loop
from peerwatch.exporters.drain.state import ControllerState, StateStore
from peerwatch.exporters.otlp import series_per_gpu_window
from peerwatch.exporters.otlp_nic import series_per_port
from peerwatch.exporters.otlp_sdk import otlp_sink
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec, decode_any
from peerwatch.settings import ExportSettings, KafkaSettings
from peerwatch.streams.tools.bench_run import WorkerProcess, produce_raw, read_topic, wait_stable
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import (
    ACTIONS,
    JOB_EVENTS,
    JOB_WINDOWS,
    NIC_SAMPLES,
    RECOMMENDATIONS,
    STRAGGLERS,
    catalogue,
)
from tests.integration.prometheus_fixture import PrometheusStack
from tests.integration.slurm_fixture import SlurmCluster

pytestmark = pytest.mark.timeout(1800)

WINDOW_S, DURATION_S, INTERVAL_S = 10, 200, 2.0
STRAGGLER, XID_GPU = ("gpu00001", 5), ("gpu00006", 2)
NIC_PORT = ("gpu00007", "mlx5_1/1")
SLOW_JOB, XID_JOB = "3001", "3002"
DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"


def scenario_doc(start_ms: int) -> dict[str, Any]:
    return {
        "fleet": {"nodes": 8, "gpus_per_node": 8, "interval_s": INTERVAL_S,
                  "duration_s": DURATION_S, "seed": 11, "start_ms": start_ms,
                  "step_times": True, "nics_per_node": 2},
        "jobs": [
            {"job_id": SLOW_JOB, "gpus": 32, "first_node": 0, "warmup_s": 0, "duration_s": 7200},
            {"job_id": XID_JOB, "gpus": 32, "first_node": 4, "warmup_s": 0, "duration_s": 7200},
        ],
        "faults": [
            {"name": "sm_clock_drop", "node": STRAGGLER[0], "gpu_index": STRAGGLER[1],
             "start_s": 20, "params": {"pct": 8}},
            {"name": "xid", "node": XID_GPU[0], "gpu_index": XID_GPU[1], "start_s": 120,
             "params": {"xid": 79}},
            {"name": "nic_symbol_errors", "node": NIC_PORT[0], "start_s": 40, "end_s": 100,
             "params": {"port": 1, "errors_per_s": 50}},
        ],
    }  # fmt: skip


@dataclass
class FleetRun:
    stack: PrometheusStack
    windows: list[dict[str, Any]]
    nic_samples: list[dict[str, Any]]
    findings: list[dict[str, Any]]
    recommendations: list[dict[str, Any]]
    worker_counters: dict[str, Any]
    agent_records: int
    ended_jobs: set[str]
    archived_records: int
    drain_actions: int

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.stack.prometheus.query(promql)

    def wait_query(
        self, promql: str, ready: Any, timeout_s: float = 60.0, must: bool = True
    ) -> list[dict[str, Any]]:
        """Query until ``ready(result)``; then, or at the timeout with ``must=False``, return the
        result; with ``must`` a timeout fails with the last result."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if ready(result):
                return result
            if time.monotonic() > deadline:
                if not must:
                    return result
                pytest.fail(f"{promql} -> {result[:5]} (collector log: "
                            f"{self.stack.collector.log_tail(10)})")  # fmt: skip
            time.sleep(1.0)


def _value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def _records(kafka: KafkaSettings, topic: str) -> list[dict[str, Any]]:
    return [decode_any(r.value)[1] for r in read_topic(kafka, topic)]


def _cli(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "peerwatch.cli", *args],
                                env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _terminate(proc: subprocess.Popen[bytes], log: Path) -> int:
    """SIGTERM and wait; the exit code (a process that ignores SIGTERM is killed and fails)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"{proc.args} ignored SIGTERM:\n{log.read_text()[-3000:]}")
    return int(proc.returncode)


@pytest.fixture(scope="module")
def fleet_run(
    prometheus_stack: PrometheusStack,
    kafka_settings: KafkaSettings,
    slurm_cluster: SlurmCluster,
    tmp_path_factory: Any,
) -> Iterator[FleetRun]:
    tmp = tmp_path_factory.mktemp("prometheus-fleet")
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka_settings, catalogue(prefix))
    now_ms = int(time.time() * 1000) - (DURATION_S + 60) * 1000
    start_ms = now_ms - now_ms % (WINDOW_S * 1000)
    fleet = Fleet(parse_scenario(scenario_doc(start_ms)))
    codecs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
    raw = [
        (prefix + STREAM_TOPICS[r.stream].name, r.key.encode(), codecs[r.stream].encode(r.value),
         int(r.value.get("ts_ms", tick)))
        for tick, recs in fleet.timed_ticks() for r in recs
    ]  # fmt: skip
    produce_raw(kafka_settings, raw)
    node_records = sum(t == prefix + STREAM_TOPICS["samples"].name for t, *_ in raw)
    collector = prometheus_stack.collector
    telemetry_env = {"PEERWATCH_TELEMETRY_ENDPOINT": collector.grpc_endpoint,
                     "PEERWATCH_TELEMETRY_INTERVAL_S": "1"}  # fmt: skip
    worker = WorkerProcess(
        kafka_settings.bootstrap_servers, prefix, f"{prefix}prom", tmp, name="worker",
        args=["--window-s", str(WINDOW_S), "--lateness-s", "5", "--loglevel", "warning"],
        env=telemetry_env,
    ).start()  # fmt: skip
    sink = otlp_sink(ExportSettings(endpoint=collector.http_endpoint, protocol="http",
                                    interval_s=1.0))  # fmt: skip
    loop, consumer, deadletter = kafka_export_loop(
        kafka_settings, sink, group_id=f"{prefix}export", topic_prefix=prefix, nic=True
    )
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), kwargs={"poll_timeout_s": 0.2})
    thread.start()
    # The archiver and the drain controller (shadow mode: it reads Slurm's nodes, never drains)
    # export their own metrics too.
    env = {**telemetry_env, "PEERWATCH_KAFKA_BOOTSTRAP": kafka_settings.bootstrap_servers,
           "PEERWATCH_TOPIC_PREFIX": prefix}  # fmt: skip
    archive_log, drain_log = tmp / "archive.log", tmp / "drain.log"
    archiver = _cli(["archive", "--dir", str(tmp / "archive"), "--group-id", f"{prefix}archive"],
                    env, archive_log)  # fmt: skip
    # With a state file its new group starts at the earliest offsets (without, at the latest:
    # recommendations made before its partitions were assigned would never be decided).
    StateStore(tmp / "drain-state.json").save(ControllerState())
    drain = _cli(["drain-controller", "run", "--state-file", str(tmp / "drain-state.json"),
                  "--slurm-bin", str(slurm_cluster.bin_dir)],
                 {**env, "PEERWATCH_DRAIN_GROUP_ID": f"{prefix}drain"}, drain_log)  # fmt: skip
    try:

        def poll() -> tuple[int, int, int]:
            assert worker.alive(), f"worker died:\n{worker.log_tail()}"
            recs = len(read_topic(kafka_settings, prefix + RECOMMENDATIONS.name))
            return int(worker.counters().get("samples", 0)), recs, loop.stats.records

        state = wait_stable(poll, lambda r: r[0] >= node_records and r[1] > 0, 180.0)
        assert state[0] >= node_records and state[1] > 0, f"{state}:\n{worker.log_tail()}"
        # The agent: no GPU here, so --allow-no-gpu; its own metrics go out with telemetry.
        agent = subprocess.run(
            [sys.executable, "-m", "peerwatch.cli", "agent", "--allow-no-gpu", "--node",
             "cpu-agent-1", "--count", "4", "--interval-s", "0.5"],
            env={**os.environ, **telemetry_env, "PEERWATCH_KAFKA_BOOTSTRAP":
                 kafka_settings.bootstrap_servers, "PEERWATCH_TOPIC_PREFIX": prefix,
                 "PEERWATCH_SPOOL_DIR": str(tmp / "spool")},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-3000:]
        windows = _records(kafka_settings, prefix + JOB_WINDOWS.name)
        nic_samples = _records(kafka_settings, prefix + NIC_SAMPLES.name)
        findings = _records(kafka_settings, prefix + STRAGGLERS.name)
        recommendations = _records(kafka_settings, prefix + RECOMMENDATIONS.name)
        # Everything on the output topics went through the exporter.
        wait_stable(lambda: loop.stats.records, lambda n: n >= len(windows) + len(nic_samples),
                    60.0, settle_s=3)  # fmt: skip
        assert sink.flush(), sink.stats()
        counters = wait_stable(worker.counters, lambda c: c.get("samples", 0) >= node_records,
                               30.0, settle_s=3)  # fmt: skip
        ended = {e["job_id"] for e in _records(kafka_settings, prefix + JOB_EVENTS.name)
                 if e["kind"] == "ENDED"}  # fmt: skip
        actions = wait_stable(lambda: len(read_topic(kafka_settings, prefix + ACTIONS.name)),
                              lambda n: n >= len({r["recommendation_id"] for r in recommendations}),
                              60.0, settle_s=3)  # fmt: skip
        assert drain.poll() is None, drain_log.read_text()[-3000:]
        assert _terminate(archiver, archive_log) == 0, archive_log.read_text()[-3000:]
        archived = json.loads(archive_log.read_text().strip().splitlines()[-1])
        yield FleetRun(
            prometheus_stack,
            windows,
            nic_samples,
            findings,
            recommendations,
            counters,
            4,
            ended,
            archived_records=int(archived["records"]),
            drain_actions=actions,
        )
    finally:
        _terminate(archiver, archive_log)
        _terminate(drain, drain_log)
        stop.set()
        thread.join(30)
        sink.close()
        consumer.close()
        deadletter.flush(10)
        worker.stop()


def test_sm_clock_ratio_per_gpu_carries_job_node_gpu_and_user(fleet_run: FleetRun) -> None:
    # Each GPU-in-job series holds the clock ratio of its latest window that had one (a window
    # without, e.g. of a lost GPU, leaves the gauge as it was). Idle GPUs are the pseudo jobs
    # "idle:<node>". The exporter drops the series of an ended job (3002 fails at its XID);
    # whatever of them reached the collector before lingers there until it expires.
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for w in sorted(fleet_run.windows, key=lambda w: w["window_start_ms"]):
        if w["clk_ratio"] is not None:
            latest[(w["job_id"], w["node"], str(w["gpu_index"]))] = w
    live = {k for k in latest if k[0] not in fleet_run.ended_jobs}
    assert XID_JOB in fleet_run.ended_jobs and sum(k[0] == SLOW_JOB for k in live) == 32
    result = fleet_run.wait_query("peerwatch_gpu_sm_clock_ratio", lambda r: len(r) >= len(live))
    got = {(s["metric"]["slurm_job_id"], s["metric"]["host_name"], s["metric"]["gpu_index"]): s
           for s in result}  # fmt: skip
    assert live <= set(got), live - set(got)
    assert {k[0] for k in set(got) - live} <= fleet_run.ended_jobs
    for key in live:
        window, labels = latest[key], got[key]["metric"]
        if window.get("user"):
            assert labels["slurm_user"] == window["user"]
        assert labels["job"] == "peerwatch"
        assert math.isclose(_value(got[key]), window["clk_ratio"], rel_tol=1e-9), key


def test_peer_relative_values_of_a_job_single_out_the_slow_gpu(fleet_run: FleetRun) -> None:
    ratio = f'peerwatch_gpu_sm_clock_ratio{{slurm_job_id="{SLOW_JOB}"}}'
    relative = fleet_run.query(f"{ratio} / scalar(quantile(0.5, {ratio}))")
    assert len(relative) == 32
    slowest = min(relative, key=_value)
    assert (slowest["metric"]["host_name"], slowest["metric"]["gpu_index"]) == (
        STRAGGLER[0],
        str(STRAGGLER[1]),
    )
    assert _value(slowest) < 0.95  # 8% SM-clock drop
    others = [_value(s) for s in relative if s is not slowest]
    assert all(0.97 < v < 1.03 for v in others), others
    # The recording rule (the peer band's centre) agrees with the query, and the joined form
    # the dashboards use gives the same answer.
    median = fleet_run.wait_query(
        f'peerwatch:gpu_sm_clock_ratio:job_median{{slurm_job_id="{SLOW_JOB}"}}', lambda r: r
    )
    direct = fleet_run.query(f"quantile(0.5, {ratio})")
    assert math.isclose(_value(median[0]), _value(direct[0]), rel_tol=1e-6)
    joined = fleet_run.query(
        f"{ratio} / on (slurm_job_id) group_left () peerwatch:gpu_sm_clock_ratio:job_median"
    )
    assert min(joined, key=_value)["metric"]["gpu_index"] == str(STRAGGLER[1])
    # The straggler score is peer-relative too: the slow GPU has the job's highest.
    top = fleet_run.query(f'topk(1, peerwatch_straggler_score_ratio{{slurm_job_id="{SLOW_JOB}"}})')
    assert (top[0]["metric"]["host_name"], top[0]["metric"]["gpu_index"]) == (
        STRAGGLER[0],
        str(STRAGGLER[1]),
    )


def _label(value: object) -> str:
    """A record's field as its metric label: absent (null) is the empty string."""
    return "" if value is None else str(value)


def test_findings_and_recommendations_are_counters(fleet_run: FleetRun) -> None:
    # Job- and fleet-level findings (JOB_WIDE, SILENT: the fleet stops publishing at the end of
    # the run while its jobs still hold their GPUs) carry no node or GPU label.
    expected = Counter(
        (f["job_id"], f.get("node") or "", _label(f.get("gpu_index")), f["status"])
        for f in {f["finding_id"]: f for f in fleet_run.findings}.values()
    )
    assert any(k[1:3] == (STRAGGLER[0], str(STRAGGLER[1])) for k in expected), expected
    total = sum(expected.values())
    result = fleet_run.wait_query(
        "peerwatch_findings_total", lambda r: sum(_value(s) for s in r) >= total
    )
    got = Counter()
    for s in result:
        m = s["metric"]
        got[(m["slurm_job_id"], m.get("host_name", ""), m.get("gpu_index", ""),
             m["peerwatch_finding_status"])] += int(_value(s))  # fmt: skip
    assert got == expected
    recs = Counter((r["node"], r["action"]) for r in
                   {r["recommendation_id"]: r for r in fleet_run.recommendations}.values())  # fmt: skip
    result = fleet_run.wait_query(
        "sum by (host_name, peerwatch_recommendation_action) (peerwatch_recommendations_total)",
        lambda r: sum(_value(s) for s in r) >= sum(recs.values()),
    )
    assert {(s["metric"]["host_name"], s["metric"]["peerwatch_recommendation_action"]):
            int(_value(s)) for s in result} == dict(recs)  # fmt: skip
    assert any(node == XID_GPU[0] for node, _ in recs)


#: This module's exporter's series (the session's Prometheus also holds other modules' ports of
#: the same simulated node names, exported under their own service namespaces).
OURS = 'job="peerwatch"'


def test_per_port_nic_metrics_are_the_records_latest_span(fleet_run: FleetRun) -> None:
    """One series per node and port; the last span (the last pair of readings: the agent ticks
    every 2 s, the exporter closes a span every 1 s) read straight off the raw counters."""
    readings: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
    for sample in sorted(fleet_run.nic_samples, key=lambda s: s["ts_ms"]):
        for reading in sample["ports"]:
            readings.setdefault((sample["node"], reading["name"]), []).append(
                (sample["ts_ms"], reading)
            )
    # The simulated nodes' ports, and the real agent's (this machine's /sys/class/net).
    simulated = {k for k in readings if k[0].startswith("gpu")}
    assert len(simulated) == 8 * 2 and NIC_PORT in simulated and len(readings) > len(simulated)
    up = fleet_run.wait_query(
        f"peerwatch_nic_link_up_ratio{{{OURS}}}", lambda r: len(r) == len(readings)
    )
    got_up = {(s["metric"]["host_name"], s["metric"]["network_interface_name"]): _value(s)
              for s in up}  # fmt: skip
    assert set(got_up) == set(readings)
    assert {got_up[k] for k in simulated} == {1.0}
    speed = fleet_run.query(f"peerwatch_nic_link_speed_Gbit_per_second{{{OURS}}}")
    assert {(s["metric"]["host_name"], s["metric"]["network_interface_name"]): _value(s)
            for s in speed if s["metric"]["host_name"].startswith("gpu")} == {
        k: readings[k][-1][1]["rate_gbps"] for k in simulated
    }  # fmt: skip

    def last_rate(key: tuple[str, str], counter: str) -> float:
        (t0, r0), (t1, r1) = readings[key][-2:]
        return (r1["counters"][counter] - r0["counters"][counter]) * 4 / ((t1 - t0) / 1000)

    tx = fleet_run.query(
        f'peerwatch_nic_io_rate_bytes_per_second{{{OURS}, network_io_direction="transmit"}}'
    )
    got = {(s["metric"]["host_name"], s["metric"]["network_interface_name"]): _value(s) for s in tx}
    for key in simulated:
        assert math.isclose(got[key], last_rate(key, "port_xmit_data"), rel_tol=1e-9), key
    # The symbol-error burst is over by the end; the stream named its port from the same
    # records (a NETWORK finding or recommendation).
    assert any(f.get("cause") == "NETWORK" and (f.get("node"), f.get("port")) == NIC_PORT
               for f in fleet_run.findings + fleet_run.recommendations)  # fmt: skip
    down = fleet_run.query(
        f'peerwatch_nic_link_down_time_seconds_total{{{OURS}, host_name=~"gpu.*"}}'
    )
    assert len(down) == len(simulated) and all(_value(s) == 0.0 for s in down)
    # Bounded: one series per port and metric (io twice), and the exporter says how many.
    per_port = fleet_run.query(f'count by (__name__) ({{{OURS}, __name__=~"peerwatch_nic_.*"}})')
    assert sum(int(_value(s)) for s in per_port) <= series_per_port() * len(readings)
    # (own metrics: under this module's exporter's service name, no other module's namespace)
    active = fleet_run.wait_query('peerwatch_exporter_port_series_active{job!~".+/.+"}',
                                  lambda r: r)  # fmt: skip
    assert [_value(s) for s in active] == [len(readings)]


def test_series_stay_bounded_per_gpu_in_a_job(fleet_run: FleetRun) -> None:
    gpus = len({(w["job_id"], w["node"], w["gpu_index"]) for w in fleet_run.windows})
    # Every series with a Slurm job label is a job-window series or a finding counter.
    per_job = fleet_run.query('count by (__name__) ({slurm_job_id!=""})')
    counts = {s["metric"]["__name__"]: int(_value(s)) for s in per_job}
    window_series = sum(n for name, n in counts.items() if name != "peerwatch_findings_total")
    assert window_series <= series_per_gpu_window() * gpus, counts
    assert counts["peerwatch_gpu_sm_clock_ratio"] <= gpus
    # peerwatch's own metrics carry no job, node or GPU label.
    own = fleet_run.query('{__name__=~"peerwatch_(stream|agent)_.*"}')
    assert own and not any(
        {"slurm_job_id", "host_name", "gpu_index"} & set(s["metric"]) for s in own
    )


def test_stream_worker_and_agent_export_their_own_metrics(fleet_run: FleetRun) -> None:
    c = fleet_run.worker_counters
    for metric, key in [("samples", "samples"), ("windows", "windows"), ("late", "late"),
                        ("deadletter", "deadletter"), ("findings", "findings"),
                        ("recommendations", "recommendations"), ("batches", "batches")]:  # fmt: skip
        promql = f'peerwatch_stream_{metric}_total{{job="peerwatch-stream"}}'
        result = fleet_run.wait_query(promql, lambda r, k=key: r and _value(r[0]) == c[k])
        assert len(result) == 1
    assert c["windows"] == len(fleet_run.windows)
    lag = fleet_run.wait_query('peerwatch_stream_consumer_lag{job="peerwatch-stream"}',
                               lambda r: r and _value(r[0]) == 0)  # fmt: skip
    assert lag
    batch_s = fleet_run.query('peerwatch_stream_batch_time_seconds_total{job="peerwatch-stream"}')
    assert math.isclose(_value(batch_s[0]), c["batch_time_s"], rel_tol=1e-6)
    agent = fleet_run.wait_query(
        'peerwatch_agent_records_total{job="peerwatch-agent"}', lambda r: r
    )
    assert [_value(s) for s in agent] == [fleet_run.agent_records]
    breaker = fleet_run.query('peerwatch_agent_breaker_open{job="peerwatch-agent"}')
    assert [_value(s) for s in breaker] == [0.0]
    # The simulated fleet was published from the past, before the worker started: a backlog
    # says nothing of node clocks, so no node gets an offset, and none is counted as skewed.
    skewed = fleet_run.wait_query(
        'peerwatch_stream_clock_skewed_nodes{job="peerwatch-stream"}', lambda r: r
    )
    assert [_value(s) for s in skewed] == [0.0] and c["clock_skewed_nodes"] == 0
    assert fleet_run.query('peerwatch_node_clock_offset_seconds{node=~"gpu.*"}') == []
    assert not any(n.startswith("gpu") for n in c["clock_offsets_ms"]), c["clock_offsets_ms"]


def test_archiver_and_drain_controller_export_their_own_metrics(fleet_run: FleetRun) -> None:
    archived = fleet_run.wait_query('peerwatch_archiver_records_total{job="peerwatch-archiver"}',
                                    lambda r: r and _value(r[0]) == fleet_run.archived_records)  # fmt: skip
    assert fleet_run.archived_records > 0 and len(archived) == 1
    decided = fleet_run.wait_query(
        'peerwatch_drain_recommendations_total{job="peerwatch-drain-controller"}',
        lambda r: r and _value(r[0]) == fleet_run.drain_actions,
    )
    assert len(decided) == 1
    breaker = fleet_run.query('peerwatch_drain_breaker_open{job="peerwatch-drain-controller"}')
    assert [_value(s) for s in breaker] == [0.0]


# --- dashboards ---------------------------------------------------------------------------------

#: Grafana's built-in interval variables, as a dashboard would get them.
BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


#: The values a user would pick to look at the scenario's slow GPU (each must be among the values
#: the variable's own query offers).
CHOSEN = {"job_id": SLOW_JOB, "node": STRAGGLER[0], "gpu": str(STRAGGLER[1])}


def _variables(run: FleetRun, dashboard: dict[str, Any]) -> dict[str, str]:
    """Each template variable's value: :data:`CHOSEN`, checked to be among the values of the
    variable's own ``label_values`` query on Prometheus (in order: a later variable may use an
    earlier one); a scope variable with "All" (cluster, partition, user) takes its all-value,
    whatever its query finds; the datasource variable names Prometheus itself."""
    values: dict[str, str] = {}
    for var in dashboard.get("templating", {}).get("list", []):
        if var["type"] == "datasource":
            assert var["query"] == "prometheus"
            continue
        query = var["definition"]
        for name, value in values.items():
            query = query.replace(f"${name}", value)
        assert query.startswith("label_values(") and query.endswith(")"), query
        selector, _, label = query[len("label_values(") : -1].rpartition(",")
        series = run.stack.prometheus.api("series", **{"match[]": selector.strip()})
        found = sorted({s[label.strip()] for s in series if label.strip() in s})
        if var["name"] not in CHOSEN:
            assert var.get("includeAll") and var.get("allValue") == ".*", var["name"]
            values[var["name"]] = ".*"
            continue
        assert CHOSEN[var["name"]] in found, f"variable {var['name']}: {query} -> {found}"
        values[var["name"]] = CHOSEN[var["name"]]
    return values


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in [*BUILTINS.items(), *((f"${k}", v) for k, v in values.items())]:
        expr = expr.replace(name, value)
    return expr


@pytest.mark.parametrize("name", ["fleet", "job", "gpu", "health"])
def test_every_dashboard_panel_query_parses_and_returns_series(
    fleet_run: FleetRun, name: str
) -> None:
    dashboard = json.loads((DASHBOARDS / f"peerwatch-{name}.json").read_text())
    values = _variables(fleet_run, dashboard)
    targets = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    assert len(targets) >= 8
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
    empty = []
    for title, expr in targets:
        promql = _substitute(expr, values)
        assert "$" not in promql, promql
        # Rates need two scrapes of a series inside their range: wait a little for the first.
        result = fleet_run.wait_query(promql, lambda r: bool(r), timeout_s=20, must=False)
        if not result:
            empty.append((title, promql))
    assert not empty
    # Annotations (findings, drains) parse and run; the fleet's and the slow GPU's find some.
    for ann in dashboard.get("annotations", {}).get("list", []):
        if "expr" not in ann:
            continue
        promql = _substitute(ann["expr"], values)
        assert "$" not in promql, promql
        result = fleet_run.query(promql)  # raises on a query Prometheus refuses
        if name in ("fleet", "job", "gpu") and ann["name"] == "Findings":
            found = fleet_run.wait_query(f"max_over_time(({promql})[10m:5s])", bool,
                                         timeout_s=20, must=False)  # fmt: skip
            assert found or result, f"no finding annotation: {promql}"


def test_the_job_panel_is_the_peer_band_and_the_slowest_gpus(fleet_run: FleetRun) -> None:
    dashboard = json.loads((DASHBOARDS / "peerwatch-job.json").read_text())
    values = _variables(fleet_run, dashboard)
    [panel] = [p for p in dashboard["panels"] if p["title"].startswith("SM clock ratio: the peer")]
    first = _substitute(panel["targets"][0]["expr"], values)
    assert first.startswith("bottomk(5, ")
    lowest = fleet_run.wait_query(first, lambda r: len(r) == 5, timeout_s=20)
    gpus = {(s["metric"]["host_name"], s["metric"]["gpu_index"]) for s in lowest}
    assert (STRAGGLER[0], str(STRAGGLER[1])) in gpus  # the straggler is among the outliers
    fills = [o for o in panel["fieldConfig"]["overrides"]
             if any(p["id"] == "custom.fillBelowTo" for p in o["properties"])]  # fmt: skip
    assert fills and fills[0]["matcher"]["options"] == "peer band p90"
    link = panel["fieldConfig"]["defaults"]["links"][0]["url"]
    assert link.startswith("/d/peerwatch-gpu/") and "var-node=${__field.labels.host_name}" in link


def test_rules_are_loaded_and_evaluate_without_errors(fleet_run: FleetRun) -> None:
    groups = fleet_run.stack.prometheus.api("rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert {"peerwatch:gpu_sm_clock_ratio:job_median", "PeerwatchStreamWorkerLagging",
            "PeerwatchNoSamples", "PeerwatchDeadLettersRising"} <= set(rules)  # fmt: skip
    deadline = time.monotonic() + 30
    while any(r.get("health") != "ok" for r in rules.values()) and time.monotonic() < deadline:
        time.sleep(1)
        rules = {r["name"]: r for g in fleet_run.stack.prometheus.api("rules")["groups"]
                 for r in g["rules"]}  # fmt: skip
    assert {n: r.get("lastError") for n, r in rules.items() if r.get("health") != "ok"} == {}
    # The worker ran and keeps reporting: the absent-worker alert is not firing.
    assert rules["PeerwatchStreamWorkerAbsent"]["state"] == "inactive"
