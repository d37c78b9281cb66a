"""LinkWatch: the NIC link rules on arrival (network_rules.LINK_RULES) over NodeNicSample dicts."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerwatch.producers.nic.counters import downtime
from peerwatch.schemas.codec import codec_for
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.link_watch import LinkWatch
from peerwatch.streams.core.network_rules import LINK_RULE_BY_NAME, LINK_RULES
from peerwatch.streams.core.policy import DrainPolicyState, apply
from peerwatch.streams.core.settings import NetworkSettings

PORT = "mlx5_0/1"


def started(job: str, node: str, *gpus: int, at_ms: int = 0) -> dict[str, Any]:
    return {"job_id": job, "kind": "STARTED", "ts_ms": at_ms, "start_ms": at_ms,
            "allocations": [{"node": node, "gpu_indices": list(gpus)}]}  # fmt: skip


def port(
    up: bool | None = True,
    rate: float | None = 400.0,
    name: str = PORT,
    rail: tuple[int, ...] = (0, 1),
    **counters: int | None,
) -> dict[str, Any]:
    hw = {k: counters.pop(k) for k in list(counters) if k in ("rnr_nak_retry_err",
          "local_ack_timeout_err", "roce_slow_restart")}  # fmt: skip
    return {
        "name": name, "kind": "IB", "device": name.split("/")[0], "port": 1,
        "link_layer": "InfiniBand", "state": "ACTIVE" if up else "DOWN",
        "phys_state": "LinkUp" if up else "Polling", "up": up, "rate_gbps": rate,
        "pci_address": None, "numa_node": None, "gpu_indices": list(rail),
        "counters": counters, "hw_counters": hw, "read_errors": 0,
    }  # fmt: skip


def sample(node: str, ts_ms: int, *ports: dict[str, Any], interval_ms: int = 1000) -> dict:
    return {"node": node, "ts_ms": ts_ms, "seq": ts_ms // 1000, "agent_run_id": "r",
            "interval_ms": interval_ms, "ports": list(ports), "read_errors": 0}  # fmt: skip


def allocated(*nodes: str) -> AllocationTable:
    alloc = AllocationTable()
    for i, node in enumerate(nodes):
        alloc.apply_event(started(f"job{i}", node, 0, 1, 2, 3))
    return alloc


def feed(watch: LinkWatch, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in samples:
        out += watch.add(s)
    return out


def test_the_catalogue_declares_every_issue_rule_with_nvsentinel_defaults() -> None:
    s = NetworkSettings()
    limits = {r.name: (r.threshold(s), r.per_s) for r in LINK_RULES if r.kind == "rate"}
    assert limits == {
        "symbol_error_rate": (10.0, 1.0),
        "link_error_recovery_rate": (5.0, 60.0),
        "port_rcv_errors_rate": (10.0, 1.0),
        "local_ack_timeout_err_rate": (1.0, 1.0),
        "port_xmit_discards_rate": (100.0, 1.0),
        "roce_slow_restart_rate": (10.0, 1.0),
    }
    rises = {r.counter for r in LINK_RULES if r.kind == "rise"}
    assert rises == {"link_downed", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors", "rnr_nak_retry_err"}  # fmt: skip
    assert LINK_RULE_BY_NAME["port_down"].threshold(s) == 7.0
    assert not LINK_RULE_BY_NAME["port_below_rated"].drain
    assert all(r.drain for r in LINK_RULES if r.name != "port_below_rated")


# -- port down ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("down_s", "fires"), [(3, False), (7, False), (8, False), (10, True), (30, True)]
)
def test_a_port_down_fires_at_the_sample_that_shows_it_passing_7_s(
    down_s: int, fires: bool
) -> None:
    """Down readings from t=1 s: the known-down time at the sample of t is t - 1 s, so it passes
    7 s at t=9 s; 8 down readings (t=1..8, up again at t=9) show 7 s at most: not longer."""
    w = LinkWatch(allocated("n1"))
    samples = [sample("n1", 0, port())]
    samples += [sample("n1", t * 1000, port(up=False)) for t in range(1, 1 + down_s)]
    samples += [sample("n1", (1 + down_s + t) * 1000, port()) for t in range(5)]
    found = feed(w, samples)
    if not fires:
        assert found == []
        return
    assert [(f["status"], f["hard_rules"], f["detected_ms"], f["port"]) for f in found] == [
        ("HARD_ERROR", ["port_down"], 9000, PORT)
    ]
    f = found[0]
    assert (f["cause"], f["node"], f["job_id"], f["gpu_index"]) == ("NETWORK", "n1", "job0", None)
    # the finding encodes with the shipped schema
    assert codec_for("StragglerFinding").decode(codec_for("StragglerFinding").encode(f)) == f


def test_a_port_down_on_an_idle_node_fires_only_once_a_job_holds_its_gpus() -> None:
    alloc = AllocationTable()
    w = LinkWatch(alloc)
    assert feed(w, [sample("n1", t * 1000, port(up=False)) for t in range(20)]) == []
    alloc.apply_event(started("7", "n1", 0, at_ms=20_000))
    found = w.add(sample("n1", 20_000, port(up=False)))
    assert [(f["job_id"], f["hard_rules"]) for f in found] == [("7", ["port_down"])]
    # once per episode: no second finding while it stays down ...
    assert feed(w, [sample("n1", t * 1000, port(up=False)) for t in range(21, 40)]) == []
    # ... and a new episode after the port came back fires again
    w.add(sample("n1", 40_000, port()))
    again = feed(w, [sample("n1", t * 1000, port(up=False)) for t in range(41, 52)])
    assert [f["detected_ms"] for f in again] == [49_000]


def test_missing_ticks_and_unreadable_states_are_not_downtime() -> None:
    """Each reading holds for at most 2 intervals: 3 down readings 10 s apart are 6 s down."""
    w = LinkWatch(allocated("n1"))
    found = feed(w, [sample("n1", t, port(up=False)) for t in (0, 10_000, 20_000, 30_000)])
    assert found == []  # 2 + 2 + 2 s known down
    # every other reading unreadable: only the down readings' second counts, and the unknown
    # ones do not end the episode: 8 such seconds pass 7 s at t=15
    w2 = LinkWatch(allocated("n1"))
    seq = [sample("n1", t * 1000, port(up=None if t % 2 else False)) for t in range(0, 30)]
    assert [f["detected_ms"] for f in feed(w2, seq)] == [15_000]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4000), st.sampled_from([True, False, None])),
                min_size=1, max_size=40))  # fmt: skip
def test_the_episode_downtime_is_the_counter_maths_downtime(
    steps: list[tuple[int, bool | None]],
) -> None:
    """LinkWatch's incremental known-down time equals counters.downtime over the episode."""
    w = LinkWatch(AllocationTable(), NetworkSettings(port_down_s=3600))  # never fires here
    t = 0
    readings: list[tuple[int, bool | None]] = []
    for gap, up in steps:
        t += gap
        readings.append((t, up))
        w.add(sample("n1", t, port(up=up)))
        mem = w.ports[("n1", PORT)]
        if up is True:
            assert mem.down_ms is None
            readings = []
            continue
        starts = [i for i, (_, u) in enumerate(readings) if u is False]
        if not starts:
            assert mem.down_ms is None
            continue
        start = readings[starts[0]][0]
        ep = [(ts, u) for ts, u in readings if ts >= start]
        expect = downtime(ep, start, t, 2000).down_s * 1000
        assert mem.down_ms == pytest.approx(expect)


# -- rises ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "counter",
    ["link_downed", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
     "rnr_nak_retry_err"],
)  # fmt: skip
def test_any_rise_fires_but_a_total_since_boot_never_does(counter: str) -> None:
    w = LinkWatch(allocated("n1"))
    assert w.add(sample("n1", 0, port(**{counter: 9}))) == []  # 9 since boot: not judged
    assert w.add(sample("n1", 1000, port(**{counter: 9}))) == []
    found = w.add(sample("n1", 2000, port(**{counter: 10})))
    assert [(f["hard_rules"], f["status"], f["port"]) for f in found] == [
        ([counter], "HARD_ERROR", PORT)
    ]


def test_a_reset_or_a_reboot_restarts_the_baseline_without_firing() -> None:
    w = LinkWatch(allocated("n1"))
    feed(w, [sample("n1", 0, port(link_downed=5)), sample("n1", 1000, port(link_downed=5))])
    assert w.add(sample("n1", 2000, port(link_downed=1))) == []  # reset (perfquery -x, reboot)
    assert w.add(sample("n1", 3000, port(link_downed=1))) == []
    assert [f["hard_rules"] for f in w.add(sample("n1", 4000, port(link_downed=2)))] == [
        ["link_downed"]
    ]


def test_a_narrow_counter_reaching_its_maximum_is_a_rise_and_staying_there_is_not() -> None:
    w = LinkWatch(allocated("n1"))
    w.add(sample("n1", 0, port(local_link_integrity_errors=14)))
    assert w.add(sample("n1", 1000, port(local_link_integrity_errors=15)))  # 4 bits: saturated
    w2 = LinkWatch(allocated("n1"), NetworkSettings(repeat_after_s=0))
    w2.add(sample("n1", 0, port(local_link_integrity_errors=15)))
    assert w2.add(sample("n1", 1000, port(local_link_integrity_errors=15))) == []


def test_a_storm_is_one_finding_and_a_rise_after_repeat_after_s_of_quiet_fires_again() -> None:
    w = LinkWatch(allocated("n1"), NetworkSettings(repeat_after_s=60))
    storm = [sample("n1", t * 1000, port(link_downed=t)) for t in range(0, 100)]
    quiet = [sample("n1", t * 1000, port(link_downed=99)) for t in range(100, 170)]
    again = [sample("n1", 170_000, port(link_downed=100))]
    found = feed(w, storm + quiet + again)
    assert [f["detected_ms"] for f in found] == [1000, 170_000]


# -- rates ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("counter", "rule", "per_tick_ok", "per_tick_bad"),
    [
        ("symbol_error", "symbol_error_rate", 10, 12),
        ("port_rcv_errors", "port_rcv_errors_rate", 10, 12),
        ("local_ack_timeout_err", "local_ack_timeout_err_rate", 1, 2),
        ("port_xmit_discards", "port_xmit_discards_rate", 100, 120),
        ("roce_slow_restart", "roce_slow_restart_rate", 10, 12),
    ],
)
def test_rate_rules_fire_above_their_limit_only(
    counter: str, rule: str, per_tick_ok: int, per_tick_bad: int
) -> None:
    steady = LinkWatch(allocated("n1"))
    ok = feed(steady, [sample("n1", t * 1000, port(**{counter: 1000 + per_tick_ok * t}))
                       for t in range(60)])  # fmt: skip
    assert ok == []
    w = LinkWatch(allocated("n1"))
    bad = feed(w, [sample("n1", t * 1000, port(**{counter: 1000 + per_tick_bad * t}))
                   for t in range(60)])  # fmt: skip
    assert [f["hard_rules"] for f in bad] == [[rule]]
    # judged over 10 s spans: it fires at the first sample whose count passes 10 s x limit
    first_t = 10 * per_tick_ok // per_tick_bad + 1
    assert bad[0]["detected_ms"] == first_t * 1000


def test_a_burst_fires_at_the_sample_that_shows_it() -> None:
    w = LinkWatch(allocated("n1"))
    w.add(sample("n1", 0, port(symbol_error=0)))
    found = w.add(sample("n1", 1000, port(symbol_error=500)))
    assert [f["detected_ms"] for f in found] == [1000]


def test_link_error_recovery_is_judged_per_minute() -> None:
    five = LinkWatch(allocated("n1"))
    # 5 recoveries a minute (one each 12 s): at the limit, never above it
    assert feed(five, [sample("n1", t * 1000, port(link_error_recovery=t // 12))
                       for t in range(0, 600)]) == []  # fmt: skip
    six = LinkWatch(allocated("n1"))
    found = feed(six, [sample("n1", t * 1000, port(link_error_recovery=t // 10))
                       for t in range(0, 600)])  # fmt: skip
    assert [f["hard_rules"] for f in found][:1] == [["link_error_recovery_rate"]]


def test_pam4_background_errors_over_a_long_uptime_never_fire() -> None:
    """A huge symbol_error total since boot and a slow trickle: no finding."""
    w = LinkWatch(allocated("n1"))
    assert feed(w, [sample("n1", t * 1000, port(symbol_error=60_000 + t // 5))
                    for t in range(300)]) == []  # fmt: skip


# -- rated speed ----------------------------------------------------------------------------------
def test_a_port_below_its_rated_speed_is_a_suspect_never_a_drain() -> None:
    w = LinkWatch(allocated("n1"))
    assert w.add(sample("n1", 0, port(rate=400.0))) == []
    found = w.add(sample("n1", 1000, port(rate=200.0)))
    assert [(f["status"], f["hard_rules"], f["cause"]) for f in found] == [
        ("SUSPECT", ["port_below_rated"], "NETWORK")
    ]
    state = DrainPolicyState()
    recs = apply(found[0], state)
    assert [(r["action"], r["port"]) for r in recs] == [("ALERT", PORT)]
    # with the rated speed configured, a port trained at half rate from the start fires too
    configured = LinkWatch(allocated("n1"), NetworkSettings(rated_gbps=400.0))
    assert configured.add(sample("n1", 0, port(rate=200.0)))


def test_a_hard_link_finding_drains_and_the_recommendation_names_the_port() -> None:
    w = LinkWatch(allocated("n1"))
    w.add(sample("n1", 0, port(link_downed=0)))
    found = w.add(sample("n1", 1000, port(link_downed=1)))
    recs = apply(found[0], DrainPolicyState())
    assert [(r["action"], r["hard"], r["port"]) for r in recs] == [("DRAIN", True, PORT)]
    assert PORT in recs[0]["reason"]
    codec_for("DrainRecommendation").encode(recs[0])


def test_the_job_is_the_owner_of_the_ports_rail() -> None:
    alloc = AllocationTable()
    alloc.apply_event(started("a", "n1", 0, 1))
    alloc.apply_event(started("b", "n1", 4, 5))
    w = LinkWatch(alloc)
    w.add(sample("n1", 0, port(link_downed=0, rail=(4, 5)), port(name="mlx5_1/1", link_downed=0)))
    found = w.add(sample("n1", 1000, port(link_downed=1, rail=(4, 5)),
                         port(name="mlx5_1/1", rail=(), link_downed=1)))  # fmt: skip
    assert [(f["port"], f["job_id"]) for f in found] == [(PORT, "b"), ("mlx5_1/1", "a")]


# -- hostile input, state -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        {"node": None, "ts_ms": 0, "ports": []},
        {"node": "n1", "ts_ms": -5, "ports": []},
        {"node": "n1", "ts_ms": True, "ports": []},
        {"node": "n1", "ts_ms": 1 << 60, "ports": []},
        {"node": "n1", "ts_ms": 0, "ports": "x"},
        {},
    ],
)
def test_bad_samples_are_skipped_and_counted(bad: dict[str, Any]) -> None:
    w = LinkWatch(allocated("n1"))
    assert w.add(bad) == []
    assert w.counters()["link_invalid_samples"] == 1


def test_bad_ports_and_values_are_counted_and_the_rest_kept() -> None:
    w = LinkWatch(allocated("n1"))
    w.add(sample("n1", 0, port(link_downed=0)))
    found = w.add(sample("n1", 1000, {"name": 7}, "junk",  # type: ignore[arg-type]
                         port(name="mlx5_1/1", link_downed=-3),
                         port(link_downed=1)))  # fmt: skip
    assert [f["port"] for f in found] == [PORT]
    c = w.counters()
    assert (c["link_invalid_ports"], c["link_bad_values"]) == (2, 1)


def test_late_and_repeated_readings_change_nothing() -> None:
    w = LinkWatch(allocated("n1"))
    w.add(sample("n1", 5000, port(link_downed=3)))
    assert w.add(sample("n1", 4000, port(link_downed=9))) == []
    assert w.add(sample("n1", 5000, port(link_downed=9))) == []
    assert w.counters()["link_stale_readings"] == 2
    assert w.add(sample("n1", 6000, port(link_downed=3))) == []


def test_snapshot_restore_round_trips_through_json_mid_episode() -> None:
    a = LinkWatch(allocated("n1"))
    first = [sample("n1", t * 1000, port(up=False, symbol_error=50 * t)) for t in range(5)]
    rest = [sample("n1", t * 1000, port(up=False, symbol_error=50 * t, link_downed=t))
            for t in range(5, 20)]  # fmt: skip
    feed(a, first)
    b = LinkWatch(allocated("n1"))
    b.restore(json.loads(json.dumps(a.snapshot())))
    assert b.snapshot() == a.snapshot()
    assert feed(b, rest) == feed(a, rest)


def test_prune_forgets_silent_ports() -> None:
    w = LinkWatch(allocated("n1", "n2"))
    w.add(sample("n1", 0, port()))
    w.add(sample("n2", 50_000, port()))
    assert w.prune(10_000) == 1
    assert list(w.ports) == [("n2", PORT)]


@pytest.mark.parametrize("bad", [-3, 1 << 64, True, 2.5, "7", [1]])
def test_every_kind_of_bad_value_is_counted_and_a_mapping_not_a_dict_is_read(bad: Any) -> None:
    """A counter value that is not an integer in [0, 2**64) is missing (counted), whichever
    way it is bad; a reading (or its counters) in a read-only mapping rather than a dict (a
    caller's own decoding) is read the same as a dict."""
    w = LinkWatch(allocated("n1"))
    w.add(sample("n1", 0, port(link_downed=0, symbol_error=0)))
    assert w.add(sample("n1", 1000, port(link_downed=bad, symbol_error=0))) == []
    assert w.counters()["link_bad_values"] == 1
    rising = port(link_downed=1)
    rising["counters"] = MappingProxyType(rising["counters"])
    found = w.add(sample("n1", 2000, MappingProxyType(rising)))  # type: ignore[arg-type]
    assert [(f["port"], f["hard_rules"]) for f in found] == [(PORT, ["link_downed"])]
