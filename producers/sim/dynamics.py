"""Per-GPU metric dynamics calibrated to H100/H200 SXM, and how faults and confounders bend them.

Healthy behaviour under training load (public captures, see STACK.md): SM clock at or just under
the 1980 MHz maximum in 15 MHz steps, peers within ~1.5%; power 550-700 W with ~13% spread
between GPUs against a 700 W limit; GPU temperature 55-80 C; SM activity 85-98%. Idle GPUs sit at
~345 MHz, ~70 W, ~30 C with the GPU-idle clocks-event bit. Cumulative counters (energy, throttle
times, ECC, PCIe replays, NVLink errors) only grow, and each throttle-time counter grows by the
tick's interval exactly while its clocks-event-reason bit is set, so the two views agree.

Randomness: per-GPU constants come from ``random.Random`` seeded with (seed, node, GPU); per-tick
jitter is read from a seeded noise table at an index hashed from (tick, GPU id), so values do not
depend on the order in which GPUs are generated and cost no random call per field.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any

from peerwatch.producers.sim.scenario import FleetSpec

# Clocks-event-reason bits (NVML nvmlClocksEventReason*).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
#: bit -> cumulative throttle-time field that grows while the bit is set.
THROTTLE_COUNTERS: tuple[tuple[int, str], ...] = (
    (SW_POWER_CAP, "throttle_sw_power_cap_ns"),
    (HW_SLOWDOWN, "throttle_hw_slowdown_ns"),
    (SW_THERMAL, "throttle_sw_thermal_ns"),
    (HW_THERMAL, "throttle_hw_thermal_ns"),
    (HW_POWER_BRAKE, "throttle_hw_power_brake_ns"),
)

# Activity modes of a GPU at a tick.
IDLE, WARMUP, TRAIN, CHECKPOINT, EVAL = range(5)
#: mode -> SM activity % (TRAIN uses the GPU's own base) and share of its training power draw.
_MODE_SM = {WARMUP: 12.0, CHECKPOINT: 3.0, EVAL: 45.0}
_MODE_LOAD = {IDLE: 0.0, WARMUP: 0.25, TRAIN: 1.0, CHECKPOINT: 0.12, EVAL: 0.55}


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    memory_total_bytes: int
    power_limit_w: int
    idle_clock_mhz: int = 345
    idle_power_w: float = 70.0
    train_power_w: float = 620.0  # nominal draw at full training load


MODELS = {
    "H100": GpuModel("NVIDIA H100 80GB HBM3", 1980, 2619, 81_559 * 2**20, 700),
    "H200": GpuModel("NVIDIA H200", 1980, 3201, 143_771 * 2**20, 700),
}
_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # an HGX board's eight GPUs
#: Fields that are null while a GPU is LOST (everything except identity).
_IDENTITY = frozenset({"index", "uuid", "state", "error", "name", "pci_bus_id"})
_NOISE_SIZE = 4096
_MASK = _NOISE_SIZE - 1
_IDLE_MEMORY_BYTES = 600 * 2**20  # driver and persistence daemon, no process


@dataclass(slots=True)
class Effects:
    """What active faults/confounders do to one GPU at one tick (defaults: nothing)."""

    clock_factor: float = 1.0
    sm_factor: float = 1.0
    temp_floor_c: float = 0.0  # a thermally throttled GPU sits at its slowdown temperature
    reasons: int = 0
    power_limit_w: float | None = None  # cluster power cap
    lost: bool = False
    pcie_width: int | None = None
    nvlink_replay_per_s: float = 0.0
    nvlink_recovery_per_s: float = 0.0
    nvlink_crc_per_s: float = 0.0

    def copy(self) -> Effects:
        return Effects(
            self.clock_factor,
            self.sm_factor,
            self.temp_floor_c,
            self.reasons,
            self.power_limit_w,
            self.lost,
            self.pcie_width,
            self.nvlink_replay_per_s,
            self.nvlink_recovery_per_s,
            self.nvlink_crc_per_s,
        )


class GpuState:
    """Per-GPU constants and cumulative state. ``tmpl`` holds every field whose value changes
    rarely (identity, limits, error counters); it is copied for each reading."""

    __slots__ = (
        "ambient_c", "clk15", "clk_base", "dyn_w", "energy_mj", "gid", "idle_w", "index",
        "lost_tmpl", "mem_used", "node_idx", "nvlink", "sm_base", "temp_c", "thr_ns", "tmpl",
        "train_w",
    )  # fmt: skip

    def __init__(self, tmpl: dict[str, Any], node_idx: int, index: int, gid: int) -> None:
        self.tmpl, self.node_idx, self.index, self.gid = tmpl, node_idx, index, gid
        self.lost_tmpl: dict[str, Any] | None = None  # built when the GPU is first lost
        self.clk_base = self.clk15 = self.sm_base = self.train_w = self.ambient_c = 0.0
        self.dyn_w = self.idle_w = 0.0
        self.mem_used = 0
        self.energy_mj = 0
        self.thr_ns = [0] * len(THROTTLE_COUNTERS)
        self.nvlink = [0.0, 0.0, 0.0]  # replay, recovery, crc (fractions carried between ticks)
        self.temp_c: float | None = None


class Dynamics:
    """Generates GPU readings for one fleet. All quantities in NVML units (MHz, mW, mJ, ns)."""

    def __init__(self, fleet: FleetSpec) -> None:
        self.fleet = fleet
        self.model = MODELS[fleet.gpu_model]
        self.interval_ms = fleet.interval_ms
        self.max_clock_mhz = self.model.sm_clock_max_mhz
        self.idle_clock_mhz = self.model.idle_clock_mhz
        self.idle_power_w = self.model.idle_power_w
        self.interval_ns = fleet.interval_ms * 1_000_000
        rng = random.Random(f"{fleet.seed}:noise")
        self.noise = [rng.uniform(-1.0, 1.0) for _ in range(_NOISE_SIZE)]
        self.salt = rng.randrange(1 << 30)
        # Temperature follows its target with a ~20 s time constant.
        self.temp_alpha = 1.0 - math.exp(-fleet.interval_s / 20.0)

    def new_gpu(self, node_idx: int, gpu_index: int) -> GpuState:
        """Build the state of GPU ``gpu_index`` on node ``node_idx``; constants are seeded by
        (seed, node, GPU), so they do not depend on construction order."""
        fleet, m = self.fleet, self.model
        node = fleet.node_name(node_idx)
        rng = random.Random(f"{fleet.seed}:{node}:{gpu_index}")
        h = hashlib.blake2b(f"{fleet.gpu_model}:{node}:{gpu_index}".encode(), digest_size=16)
        u = h.hexdigest()
        bus = _BUS_IDS[gpu_index] if gpu_index < len(_BUS_IDS) else f"{0xC0 + gpu_index:02x}"
        ecc_life = rng.choice((0, 0, 0, 1, 2, 5))
        tmpl: dict[str, Any] = {
            "index": gpu_index,
            "uuid": f"GPU-{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:32]}",
            "state": "OK",
            "error": None,
            "name": m.name,
            "pci_bus_id": f"00000000:{bus}:00.0",
            "sm_clock_mhz": 0,
            "sm_clock_max_mhz": m.sm_clock_max_mhz,
            "mem_clock_mhz": m.mem_clock_mhz,
            "clocks_event_reasons": 0,
            **{name: 0 for _, name in THROTTLE_COUNTERS},
            "power_mw": 0,
            "power_limit_mw": m.power_limit_w * 1000,
            "energy_mj": 0,
            "temperature_c": 0,
            "memory_temperature_c": 0,
            "gpu_util_pct": 0,
            "mem_util_pct": 0,
            "sm_active_pct": 0.0,
            "memory_used_bytes": 0,
            "memory_total_bytes": m.memory_total_bytes,
            "ecc_volatile_corrected": 0,
            "ecc_volatile_uncorrected": 0,
            "ecc_aggregate_corrected": ecc_life,
            "ecc_aggregate_uncorrected": 0,
            "remapped_rows_correctable": 1 if ecc_life >= 5 else 0,
            "remapped_rows_uncorrectable": 0,
            "remap_pending": False,
            "remap_failed": False,
            "pcie_replay_count": rng.choice((0, 0, 0, 0, 1, 3)),
            "pcie_link_width": 16,
            "pcie_link_width_max": 16,
            "pcie_link_gen": 5,
            "pcie_link_gen_max": 5,
            "nvlink_replay_errors": 0,
            "nvlink_recovery_errors": 0,
            "nvlink_crc_errors": 0,
            "recovery_action": 0,
        }
        g = GpuState(tmpl, node_idx, gpu_index, node_idx * fleet.gpus_per_node + gpu_index)
        g.clk_base = 1.0 - rng.uniform(0.0, 0.006)  # silicon lottery: peers within ~1%
        g.train_w = m.train_power_w * rng.uniform(0.935, 1.065)  # ~13% spread
        g.sm_base = rng.uniform(89.0, 96.0)
        g.ambient_c = rng.uniform(24.0, 30.0)
        g.mem_used = int(m.memory_total_bytes * rng.uniform(0.72, 0.9))
        g.clk15 = m.sm_clock_max_mhz * g.clk_base / 15.0
        g.dyn_w = g.train_w - m.idle_power_w
        g.idle_w = m.idle_power_w * rng.uniform(0.93, 1.07)
        g.energy_mj = rng.randrange(10**9, 10**11)  # energy since a driver load days ago
        g.thr_ns[0] = rng.randrange(0, 10**12)  # some SW power-cap time before we started
        g.tmpl["throttle_sw_power_cap_ns"] = g.thr_ns[0]
        return g

    def read(
        self, g: GpuState, tick: int, mode: int, smf: float, eff: Effects | None
    ) -> dict[str, Any]:
        """One GPU reading (a GpuReading dict) for ``tick``, advancing cumulative counters.

        ``mode`` is the activity (IDLE, WARMUP, TRAIN, CHECKPOINT, EVAL), ``smf`` a factor on SM
        activity from the job (pipeline stage, network slowdown), ``eff`` the active effects.
        """
        if eff is not None and eff.lost:
            if g.lost_tmpl is None:
                g.lost_tmpl = {k: (v if k in _IDENTITY else None) for k, v in g.tmpl.items()}
                g.lost_tmpl.update(state="LOST", error="GPU is lost")
            return g.lost_tmpl.copy()
        noise = self.noise
        h = (tick * 7919 + g.gid * 104_729 + self.salt) & _MASK
        n2, n3 = noise[(h + 1) & _MASK], noise[(h + 2) & _MASK]
        if mode == IDLE:
            clk = self.idle_clock_mhz
            sm = 0.0
            power_w = g.idle_w * (1.0 + 0.03 * n2)
            reasons = GPU_IDLE
            mem_used = _IDLE_MEMORY_BYTES
        else:
            # Per-GPU constants were pre-scaled (clk15 = max clock * silicon factor / 15 MHz).
            clk = int(g.clk15 * (1.0 + 0.002 * noise[h]) + 0.5) * 15
            sm = (g.sm_base if mode == TRAIN else _MODE_SM[mode]) * smf + 1.2 * n3
            load = _MODE_LOAD[mode] * (0.3 + 0.7 * smf)
            power_w = self.idle_power_w + g.dyn_w * load * (1.0 + 0.02 * n2)
            reasons = 0
            mem_used = g.mem_used
        target_c = 0.0
        if eff is not None:
            clk, power_w, reasons = self._bend(g, mode, eff, clk, power_w, reasons, n2)
            sm *= eff.sm_factor
            target_c = eff.temp_floor_c
        if clk > self.max_clock_mhz:
            clk = self.max_clock_mhz
        target_c = max(target_c, g.ambient_c + power_w * 0.065)
        temp = g.temp_c
        temp = target_c if temp is None else temp + (target_c - temp) * self.temp_alpha
        g.temp_c = temp
        g.energy_mj += int(power_w * self.interval_ms)  # W * ms = mJ
        sm = 0.0 if sm < 0.0 else 100.0 if sm > 100.0 else sm
        util = 0 if mode == IDLE else int(sm * 1.08 + 3.0)

        d = g.tmpl.copy()
        d["sm_clock_mhz"] = clk
        d["clocks_event_reasons"] = reasons
        if reasons & ~GPU_IDLE:
            thr = g.thr_ns
            for i, (bit, name) in enumerate(THROTTLE_COUNTERS):
                if reasons & bit:
                    thr[i] += self.interval_ns
                    d[name] = g.tmpl[name] = thr[i]
        d["power_mw"] = int(power_w * 1000.0)
        d["energy_mj"] = g.energy_mj
        d["temperature_c"] = int(temp + 0.5)
        d["memory_temperature_c"] = int(temp + 5.5 + n3)
        d["gpu_util_pct"] = util if util < 100 else 100
        d["mem_util_pct"] = int(sm * 0.45)
        d["sm_active_pct"] = int(sm * 10.0 + 0.5) / 10.0
        d["memory_used_bytes"] = mem_used
        if eff is not None:
            if eff.power_limit_w is not None:
                d["power_limit_mw"] = int(eff.power_limit_w * 1000)
            if eff.pcie_width is not None:
                d["pcie_link_width"] = eff.pcie_width
            if eff.nvlink_replay_per_s or eff.nvlink_recovery_per_s or eff.nvlink_crc_per_s:
                self._nvlink(g, d, eff)
        return d

    def _bend(
        self,
        g: GpuState,
        mode: int,
        eff: Effects,
        clk: int,
        power_w: float,
        reasons: int,
        n2: float,
    ) -> tuple[int, float, int]:
        """Apply effects to clock (MHz), power (W) and clocks-event reasons."""
        power_w *= 0.3 + 0.7 * eff.sm_factor
        factor = 1.0
        if mode != IDLE:
            factor = eff.clock_factor
            power_w *= factor * factor  # lower clock, lower voltage
            reasons |= eff.reasons
        limit = eff.power_limit_w
        if limit is not None and power_w > limit:
            # The SW power cap pins the draw at the limit and pulls the clock down with it;
            # scaled from the model's nominal draw, so capped peers still agree.
            nominal = self.model.train_power_w * _MODE_LOAD[mode]
            factor *= min(1.0, (limit / max(nominal, 1.0)) ** 0.45)
            power_w = limit * (0.985 + 0.01 * n2)
            reasons |= SW_POWER_CAP
        if factor != 1.0:
            clk = int(clk * factor / 15.0 + 0.5) * 15
        return clk, power_w, reasons

    def _nvlink(self, g: GpuState, d: dict[str, Any], eff: Effects) -> None:
        s = self.fleet.interval_s
        rates = (eff.nvlink_replay_per_s, eff.nvlink_recovery_per_s, eff.nvlink_crc_per_s)
        names = ("nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors")
        for i, (rate, name) in enumerate(zip(rates, names, strict=True)):
            g.nvlink[i] += rate * s
            whole = int(g.nvlink[i])
            if whole:
                g.nvlink[i] -= whole
                d[name] = g.tmpl[name] = g.tmpl[name] + whole


def apply_xid(g: GpuState, xid: int) -> None:
    """Leave the traces an XID leaves in the GPU's counters (79 is modelled as LOST by the
    caller). Application XIDs (13, 31, 43, 45, 68) leave none."""
    t = g.tmpl
    if xid in (48, 94, 95):  # double-bit / contained / uncontained ECC
        t["ecc_volatile_uncorrected"] += 1
        t["ecc_aggregate_uncorrected"] += 1
        t["recovery_action"] = 2 if xid == 95 else 1
    if xid in (48, 63):  # an uncorrectable error row was remapped, effective after a reset
        t["remapped_rows_uncorrectable"] += 1
        t["remap_pending"] = True
    if xid == 64:
        t["remap_failed"] = True
    if xid == 74:
        t["nvlink_recovery_errors"] += 1
        t["nvlink_crc_errors"] += 16
    if xid == 92:  # high single-bit ECC rate
        t["ecc_volatile_corrected"] += 1000
        t["ecc_aggregate_corrected"] += 1000
