"""The network of one job compared across its nodes (network_peers): robust z, floors, effect
gates, the job-wide condition, persistence in seconds, state round trip."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerwatch.producers.nic.window import PortWindow
from peerwatch.schemas.codec import codec_for
from peerwatch.streams.core.network_peers import FEATURES, NetworkPeers, compare_ports
from peerwatch.streams.core.policy import DrainPolicyState, apply
from peerwatch.streams.core.settings import NetworkSettings

PORT = "mlx5_0/1"
W = 5000  # the detector's default window (ms)


def pw(start: int = 0, port: str = PORT, rate: float = 400.0, down_s: float = 0.0,
       **rates: float) -> PortWindow:  # fmt: skip
    base = {"port_xmit_data": 20e9, "port_rcv_data": 20e9, "port_xmit_wait": 1e5,
            "symbol_error": 0.0, "local_ack_timeout_err": 0.0, "np_cnp_sent": 5.0}  # fmt: skip
    base.update(rates)
    return PortWindow(port, start, start + W, 5, base, down_s, 0.0, 0, (), (), rate)


def job(
    n: int, start: int = 0, seed: int = 0, **odd: dict[str, Any]
) -> dict[str, list[PortWindow]]:
    """``n`` nodes with healthy, slightly noisy ports; ``odd``: node -> port-window overrides."""
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        node = f"n{i:02d}"
        noisy = {"port_xmit_data": 20e9 * rng.uniform(0.97, 1.03),
                 "port_rcv_data": 20e9 * rng.uniform(0.97, 1.03),
                 "port_xmit_wait": 1e5 * rng.uniform(0.8, 1.2),
                 "np_cnp_sent": 5.0 * rng.uniform(0.5, 1.5)}  # fmt: skip
        noisy.update(odd.get(node, {}))
        out[node] = [pw(start, **noisy)]
    return out


def named(found: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [(f["node"], f["port"], f["status"]) for f in found]


# a node whose link waits: 40% of its window blocked (8 bytes a tick over 50 GB/s)
WAITING = {"port_xmit_wait": 0.40 * 50e9 / 8}


@pytest.mark.parametrize(
    ("odd", "feature"),
    [
        (WAITING, "net_wait"),
        ({"local_ack_timeout_err": 50.0}, "net_retrans"),
        ({"symbol_error": 30.0}, "net_errors"),
        ({"np_cnp_sent": 5000.0}, "net_cnp"),
        ({"port_xmit_data": 8e9}, "net_tx"),
        ({"port_rcv_data": 8e9}, "net_rx"),
        ({"down_s": 3.0}, "net_down"),
    ],
)
def test_one_degraded_port_is_flagged_by_its_feature(odd: dict[str, float], feature: str) -> None:
    nodes = job(16, n05=odd)
    verdicts = compare_ports(nodes, NetworkSettings())
    flagged = [(v.node, v.port, v.flags) for v in verdicts if v.flags]
    assert flagged == [("n05", PORT, (feature,))]
    ev = next(v for v in verdicts if v.flags).evidence[0]
    assert ev["feature"] == feature and abs(ev["z"]) >= 3.5


def test_healthy_noise_flags_nothing() -> None:
    for seed in range(20):
        assert not [v for v in compare_ports(job(32, seed=seed), NetworkSettings()) if v.flags]


@pytest.mark.parametrize(
    "odd",
    [
        {"symbol_error": 0.6},  # above a zero median but under the effect gate (1/s)
        {"port_xmit_data": 17e9},  # 15% low: under the 25% effect gate
        {"port_xmit_wait": 0.05 * 50e9 / 8},  # 5% wait: under the 10-point gate
    ],
)
def test_the_effect_gates_keep_small_differences_out(odd: dict[str, float]) -> None:
    assert not [v for v in compare_ports(job(16, n03=odd), NetworkSettings()) if v.flags]


def test_too_few_nodes_are_not_compared() -> None:
    verdicts = compare_ports(job(3, n01=WAITING), NetworkSettings())
    assert all(v.score is None and not v.flags for v in verdicts)


def test_ports_are_compared_rail_by_rail() -> None:
    """mlx5_1/1 is compared with mlx5_1/1 only: its different traffic does not flag it."""
    nodes = job(8)
    for i, ports in enumerate(nodes.values()):
        ports.append(pw(port="mlx5_1/1", port_xmit_data=2e9 * (1 + i / 100)))
    nodes["n02"][1] = pw(port="mlx5_1/1", **WAITING)
    flagged = [(v.node, v.port) for v in compare_ports(nodes, NetworkSettings()) if v.flags]
    assert flagged == [("n02", "mlx5_1/1")]


def test_hostile_values_are_left_out() -> None:
    nodes = job(8, n01={"symbol_error": float("nan")}, n02={"symbol_error": float("inf")})
    assert not [v for v in compare_ports(nodes, NetworkSettings()) if v.flags]


def windows(peers: NetworkPeers, count: int, job_wide: bool = True, first: int = 0,
            **odd: dict[str, float]) -> list[dict[str, Any]]:  # fmt: skip
    out: list[dict[str, Any]] = []
    for k in range(first, first + count):
        out += peers.window("j1", k * W, (k + 1) * W, job(32, start=k * W, seed=k, **odd), job_wide)
    return out


def test_a_slow_link_in_a_32_node_job_is_named_with_cause_network_after_confirm_s() -> None:
    peers = NetworkPeers()
    found = windows(peers, 20, n17=WAITING)
    assert named(found) == [("n17", PORT, "CONFIRMED")]
    f = found[0]
    # confirm_s = 10 s of 5 s windows: the second flagged window confirms
    assert (f["window_start_ms"], f["first_flagged_ms"], f["detected_ms"]) == (W, 0, 2 * W)
    assert (f["cause"], f["gpu_index"], f["peer_group_size"]) == ("NETWORK", None, 32)
    assert f["features"][0]["feature"] == "net_wait"
    codec = codec_for("StragglerFinding")
    assert codec.decode(codec.encode(f)) == f
    # the policy alerts naming the port, never drains
    recs = apply(f, DrainPolicyState())
    assert [(r["action"], r["port"]) for r in recs] == [("ALERT", PORT)]


def test_without_the_job_wide_verdict_nothing_is_named_until_it_comes() -> None:
    peers = NetworkPeers()
    assert windows(peers, 6, job_wide=False, n17=WAITING) == []
    later = windows(peers, 1, job_wide=True, first=6, n17=WAITING)
    assert named(later) == [("n17", PORT, "CONFIRMED")]


def test_when_no_node_stands_out_the_job_wide_verdict_stays() -> None:
    assert windows(NetworkPeers(), 20) == []


def test_when_most_nodes_stand_out_no_node_is_named() -> None:
    odd = {f"n{i:02d}": WAITING for i in range(20)}
    assert windows(NetworkPeers(), 10, **odd) == []


def test_a_single_window_blip_is_not_persistent() -> None:
    peers = NetworkPeers()
    found = windows(peers, 1, n17=WAITING) + windows(peers, 10, first=1)
    assert found == []


def test_one_finding_per_episode_and_a_new_one_after_a_clean_span() -> None:
    peers = NetworkPeers()
    first = windows(peers, 10, n17=WAITING)
    clean = windows(peers, 7, first=10)  # confirm_span_s 30 s = 6 windows clean ends it
    again = windows(peers, 3, first=17, n17=WAITING)
    assert (len(first), clean, len(again)) == (1, [], 1)
    assert again[0]["finding_id"] != first[0]["finding_id"]


def test_a_redelivered_window_changes_nothing() -> None:
    peers = NetworkPeers()
    windows(peers, 1, n17=WAITING)
    snap = json.dumps(peers.snapshot(), sort_keys=True)
    assert windows(peers, 1, n17=WAITING) == []
    assert json.dumps(peers.snapshot(), sort_keys=True) == snap


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 12), st.integers(0, 20))
def test_snapshot_restore_mid_episode_gives_the_same_findings(cut: int, seed: int) -> None:
    odd = {f"n{seed % 32:02d}": WAITING}
    a = NetworkPeers()
    windows(a, cut, **odd)
    b = NetworkPeers()
    b.restore(json.loads(json.dumps(a.snapshot())))
    assert windows(b, 12 - cut + 2, first=cut, **odd) == windows(a, 12 - cut + 2, first=cut, **odd)


def test_end_job_forgets_it() -> None:
    peers = NetworkPeers()
    windows(peers, 2, n17=WAITING)
    peers.end_job("j1")
    assert peers.snapshot() == {"jobs": {}, "last_window": {}}


def test_every_feature_has_a_bad_direction() -> None:
    assert {f.direction for f in FEATURES} <= {1, -1}
    assert len({f.name for f in FEATURES}) == len(FEATURES)


def test_prune_forgets_quiet_jobs() -> None:
    peers = NetworkPeers()
    windows(peers, 2, n17=WAITING)
    peers.window("j2", 50 * W, 51 * W, job(8, start=50 * W), True)
    assert peers.prune(10 * W) == 1
    assert sorted(peers.snapshot()["last_window"]) == ["j2"]  # type: ignore[call-overload]
