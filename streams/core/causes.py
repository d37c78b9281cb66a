"""The named cause of a straggler finding, from the window's evidence (DETECTION.md step 11).

Pure: one GpuWindow and the features that flagged it in, a FindingCause symbol out. The rules,
first match wins:

1. ``THERMAL``: the GPU spent at least ``effect_thr`` of the window in HW or SW thermal slowdown
   (``thermal_frac``), more than in power braking, and was not flagged on SM activity alone;
2. ``POWER``: the same for the HW power brake (``power_brake_frac``), or the GPU sat at its SW
   power cap for at least ``cause_power_cap_frac`` of the window;
3. ``LINK``: its PCIe link ran below its maximum width, or NVLink errors or PCIe replays rose;
4. ``CLOCKS``: the clock is low (clk flagged) with none of the reasons above: lowered
   application/locked clocks or a clock the driver does not explain;
5. ``HOST``: SM activity below its peers while the clock is not flagged: the GPU waits for its
   host (data loader, CPU, storage);
6. ``UNKNOWN``: anything else (throttling with only the generic HW-slowdown reason, a slow step
   with normal clocks and activity, windows from before the per-reason fields existed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from peerwatch.schemas.records import FindingCause, GpuWindow
from peerwatch.streams.core.settings import DetectorSettings

THERMAL: FindingCause = "THERMAL"
POWER: FindingCause = "POWER"
CLOCKS: FindingCause = "CLOCKS"
LINK: FindingCause = "LINK"
HOST: FindingCause = "HOST"
HARDWARE: FindingCause = "HARDWARE"
UNKNOWN: FindingCause = "UNKNOWN"


def _frac(window: GpuWindow, name: str) -> float:
    value = window.get(name)
    return 0.0 if value is None else float(value)  # type: ignore[arg-type]


def straggler_cause(
    window: GpuWindow,
    flags: Iterable[str],
    settings: DetectorSettings,
    sm_low: bool = True,
) -> FindingCause:
    """The cause of one flagged GPU window (``flags``: the features that made it a candidate;
    ``sm_low``: its SM activity is below the peers', not above)."""
    flagged = frozenset(flags)
    thermal = _frac(window, "thermal_frac")
    brake = _frac(window, "power_brake_frac")
    # Flagged on SM activity alone, the GPU is not slow through its clocks: its thermal or
    # power state (shared by its peers in a cooling event) is not why it is behind.
    sm_only = bool(flagged) and flagged <= {"sm"}
    if max(thermal, brake) >= settings.effect_thr and not sm_only:
        return THERMAL if thermal >= brake else POWER
    if _frac(window, "power_cap_frac") >= settings.cause_power_cap_frac and (
        "clk" in flagged or "thr" in flagged
    ):
        return POWER
    width, width_max = window.get("pcie_link_width_min"), window.get("pcie_link_width_max")
    if (width is not None and width_max is not None and width < width_max) or (
        int(window.get("nvlink_errors_delta") or 0) > 0
        or int(window.get("pcie_replay_delta") or 0) > 0
    ):
        return LINK
    if "clk" in flagged:
        return CLOCKS
    if "sm" in flagged and sm_low:
        return HOST
    return UNKNOWN


def majority_cause(causes: Iterable[FindingCause]) -> FindingCause:
    """The most common cause (ties: the first in FindingCause order); UNKNOWN for none."""
    counts = Counter(causes)
    if not counts:
        return UNKNOWN
    order = (THERMAL, POWER, CLOCKS, LINK, HOST, HARDWARE, UNKNOWN)
    return max(order, key=lambda c: (counts.get(c, 0), -order.index(c)))
