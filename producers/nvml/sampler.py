"""One NodeGpuSample per tick: every GPU of the node, read through the plan its probe made.

Per-tick cost: the plan holds only reads that worked at probe time, static capabilities are read
once, and field-value quantities (throttle counters, ECC, NVLink, recovery action, ...) come from
one ``nvmlDeviceGetFieldValues`` call per GPU.

GPU states: a GPU that falls off the bus (``NVMLError_GpuIsLost`` on any call) is LOST with every
quantity null, and stays LOST without further NVML calls (NVML never gets a lost GPU back without a
reset, after which the agent restarts). Another NVML error on a read keeps the other quantities,
nulls that one and marks the reading ERROR with the message.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any, cast

import pynvml

from peerwatch.clock import Clock
from peerwatch.producers.nvml.device import NvmlApi, is_unsupported
from peerwatch.producers.nvml.probe import GpuProbe, free_gpm, probe_gpus
from peerwatch.producers.nvml.reads import ENERGY_READ, field_value
from peerwatch.schemas.records import GpuReading, NodeGpuSample, XidEvent

log = logging.getLogger(__name__)

# Every nullable quantity of io.peerwatch.GpuReading (the unit test checks this against the schema).
QUANTITY_FIELDS: tuple[str, ...] = (
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "clocks_event_reasons",
    "throttle_sw_power_cap_ns",
    "throttle_hw_slowdown_ns",
    "throttle_sw_thermal_ns",
    "throttle_hw_thermal_ns",
    "throttle_hw_power_brake_ns",
    "power_mw",
    "power_limit_mw",
    "energy_mj",
    "temperature_c",
    "memory_temperature_c",
    "gpu_util_pct",
    "mem_util_pct",
    "sm_active_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "ecc_volatile_corrected",
    "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remap_pending",
    "remap_failed",
    "pcie_replay_count",
    "pcie_link_width",
    "pcie_link_width_max",
    "pcie_link_gen",
    "pcie_link_gen_max",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_errors",
    "recovery_action",
)


class _GpuLost(Exception):
    """A field value reported NVML_ERROR_GPU_IS_LOST (the call itself returned success)."""


def _empty_reading(probe: GpuProbe, state: str, error: str | None) -> dict[str, Any]:
    reading: dict[str, Any] = {
        "index": probe.index,
        "uuid": probe.uuid,
        "state": state,
        "error": error,
        "name": probe.name,
        "pci_bus_id": probe.pci_bus_id,
    }
    for key in QUANTITY_FIELDS:
        reading[key] = None
    return reading


class GpuSampler:
    """Reads all GPUs of a node into NodeGpuSample dicts.

    ``nvml`` must be initialised (``device.init_nvml``) before the first ``probe``/``sample``.
    Probing happens once, on ``probe()`` or lazily on the first ``sample``.
    """

    def __init__(
        self,
        nvml: NvmlApi,
        node: str,
        interval_ms: int,
        clock: Clock,
        *,
        agent_run_id: str | None = None,
        field_source: object | None = None,
        energy_interval_ms: int | None = None,
    ) -> None:
        """``energy_interval_ms``: read the energy counter only in the first sample of each
        interval of this many ms on the wall-clock grid (None: in every sample); between, the
        record's ``energy_mj`` is null and the stream's energy delta spans the interval."""
        if energy_interval_ms is not None and energy_interval_ms <= 0:
            raise ValueError(f"energy_interval_ms must be positive, got {energy_interval_ms}")
        self._energy_interval_ms = energy_interval_ms
        self._energy_slot: int | None = None
        self._nvml = nvml
        self.node = node
        self.interval_ms = interval_ms
        self._clock = clock
        self.agent_run_id = agent_run_id or uuid.uuid4().hex
        self._field_source = field_source
        self._probes: list[GpuProbe] | None = None
        self._driver_version: str | None = None

    @property
    def probes(self) -> list[GpuProbe]:
        """Per-GPU probe results (probing first if needed)."""
        if self._probes is None:
            self.probe()
        assert self._probes is not None
        return self._probes

    @property
    def driver_version(self) -> str | None:
        return self._driver_version

    def probe(self) -> list[GpuProbe]:
        """Probe every GPU once (idempotent). Raises ``pynvml.NVMLError`` if the GPU count
        cannot be read (NVML not initialised or broken)."""
        if self._probes is None:
            try:
                self._driver_version = self._nvml.nvmlSystemGetDriverVersion()
            except pynvml.NVMLError as exc:
                log.warning("driver version unavailable: %s", exc)
            self._probes = probe_gpus(self._nvml, self._field_source)
        return self._probes

    def sample(self, seq: int, xids: Iterable[XidEvent] = ()) -> NodeGpuSample:
        """Read every GPU now and return one NodeGpuSample dict.

        ``seq`` is the record's sequence number; ``xids`` are XidEvent dicts seen since the
        previous record. ``ts_ms`` (ms since the epoch) is taken from the clock before the reads.
        Never raises for per-GPU NVML errors: they become LOST / ERROR readings.
        """
        ts_ms = self._clock.now_ms()
        energy = True
        if self._energy_interval_ms is not None:
            slot = ts_ms // self._energy_interval_ms
            energy, self._energy_slot = slot != self._energy_slot, slot
        gpus = [self._read_gpu(p, energy) for p in self.probes]
        return {
            "node": self.node,
            "ts_ms": ts_ms,
            "seq": seq,
            "agent_run_id": self.agent_run_id,
            "interval_ms": self.interval_ms,
            "driver_version": self._driver_version,
            "gpus": gpus,
            "xids": list(xids),
        }

    def close(self) -> None:
        """Free NVML resources held by the sampler (GPM sample buffers). Never raises."""
        for probe in self._probes or ():
            free_gpm(self._nvml, probe)

    # -- per GPU ---------------------------------------------------------------------------

    def _read_gpu(self, probe: GpuProbe, energy: bool = True) -> GpuReading:
        # The cast: a reading is a dict under construction, filled key by key from the probe's
        # reads (each a partial reading keyed by the schema's field names); _empty_reading sets
        # every field first. The codec checks each record against the schema when encoding.
        return cast(GpuReading, self._assemble(probe, energy))

    def _assemble(self, probe: GpuProbe, energy: bool) -> dict[str, Any]:
        if probe.lost:
            return _empty_reading(probe, "LOST", probe.error or "GPU is lost")
        if probe.handle is None:
            return _empty_reading(probe, "ERROR", probe.error)
        reading = _empty_reading(probe, "OK", None)
        errors: list[str] = [probe.error] if probe.error else []
        try:
            reading.update(probe.static)
            for name, read in list(probe.reads.items()):
                if energy or name != ENERGY_READ:
                    self._apply(probe, name, read, reading, errors)
            self._read_fields(probe, reading, errors)
            self._read_gpm(probe, reading, errors)
        except (pynvml.NVMLError_GpuIsLost, _GpuLost) as exc:
            probe.lost = True
            probe.error = str(exc) or "GPU is lost"
            free_gpm(self._nvml, probe)
            log.error("GPU %d (%s) lost: %s", probe.index, probe.uuid, probe.error)
            return _empty_reading(probe, "LOST", probe.error)
        except Exception as exc:
            # A bug or an unexpected binding answer must not stop the agent's other GPUs.
            log.exception("GPU %d: unexpected error while sampling", probe.index)
            return _empty_reading(probe, "ERROR", f"{type(exc).__name__}: {exc}")
        if errors:
            reading["state"] = "ERROR"
            reading["error"] = "; ".join(errors)
        return reading

    def _apply(
        self,
        probe: GpuProbe,
        name: str,
        read: Any,
        reading: dict[str, Any],
        errors: list[str],
    ) -> None:
        try:
            reading.update(read(self._nvml, probe.handle))
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError as exc:
            if is_unsupported(exc):
                # Support can vanish (e.g. a permission change): stop asking, publish null.
                del probe.reads[name]
                probe.unsupported.add(name)
            else:
                errors.append(f"{name}: {exc}")

    def _read_fields(self, probe: GpuProbe, reading: dict[str, Any], errors: list[str]) -> None:
        if not probe.field_ids:
            return
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(probe.handle, probe.field_ids)
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError as exc:
            if is_unsupported(exc):
                probe.field_ids = []
                probe.field_keys.clear()
            else:
                errors.append(f"nvmlDeviceGetFieldValues: {exc}")
            return
        got: dict[int, int | float] = {}
        for fv in values:
            ret = fv.nvmlReturn
            if ret == pynvml.NVML_SUCCESS:
                v = field_value(fv)
                if v is not None:
                    got[int(fv.fieldId)] = v
            elif ret == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(str(pynvml.NVMLError(ret)))
        for key, ids in probe.field_keys.items():
            # A sum is only meaningful when every component arrived this tick.
            if all(fid in got for fid in ids):
                # Every field-value quantity is an integer in the schema (int or long).
                reading[key] = int(sum(got[fid] for fid in ids))

    def _read_gpm(self, probe: GpuProbe, reading: dict[str, Any], errors: list[str]) -> None:
        gpm = probe.gpm
        if gpm is None:
            return
        try:
            self._nvml.nvmlGpmSampleGet(probe.handle, gpm.cur)
            gpm.metrics.sample1 = gpm.prev
            gpm.metrics.sample2 = gpm.cur
            self._nvml.nvmlGpmMetricsGet(gpm.metrics)
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError as exc:
            if is_unsupported(exc):
                free_gpm(self._nvml, probe)
                probe.unsupported.add("gpm")
            else:
                errors.append(f"GPM: {exc}")
            return
        # The buffer just filled is the next tick's "previous" sample.
        gpm.prev, gpm.cur = gpm.cur, gpm.prev
        metric = gpm.metrics.metrics[0]
        if metric.nvmlReturn == pynvml.NVML_SUCCESS:
            reading["sm_active_pct"] = float(metric.value)
