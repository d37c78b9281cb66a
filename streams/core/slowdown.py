"""The one slowdown figure of a flagged GPU, shown by ``peerwatch job``, its report page, the
incident report and the demo (see docs/detection.md, "The slowdown figure").

**Slowdown** = how far the GPU's lead signal stood from its peers' median, in its slow
direction, averaged over the findings that flagged it (SUSPECT, CONFIRMED, HARD_ERROR); each
finding's evidence gives the GPU's value and the peers' median for the windows it judged:

* SM clock, power: ``1 - value / peer_median`` (0.081 = 8.1% slower clock than the peers);
* step time: ``value / peer_median - 1`` (longer steps are slower);
* SM activity: ``|1 - value / peer_median|`` (off the peers either way);
* throttled share: ``value - peer_median``, in share points (0.30 = 30 points more throttled).

The lead signal is the finding feature with the largest z in its slow direction (power is
evidence only, never the lead). A figure that needs only findings is the same wherever a
finding is seen: live in the demo, from Kafka or an archive in ``peerwatch job``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Feature -> words for the signal.
FEATURE_WORDS: dict[str, str] = {
    "clk": "SM clock",
    "thr": "throttling",
    "sm": "SM activity",
    "step": "step time",
    "power": "power",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if f == f and abs(f) != float("inf") else None


def slow_z(feature: str, z: float) -> float:
    """A finding feature's z in its slow direction (DETECTION.md; power is evidence only)."""
    if feature in ("clk", "power"):
        return -z
    if feature == "sm":
        return abs(z)
    return z


def lead_feature(features: Iterable[Any]) -> str | None:
    """The feature with the largest positive slow-direction z (never power); None if none."""
    best: tuple[float, str] | None = None
    for ev in features:
        if not isinstance(ev, Mapping):
            continue
        name, z = ev.get("feature"), _number(ev.get("z"))
        if not isinstance(name, str) or z is None or name == "power":
            continue
        s = slow_z(name, z)
        if best is None or s > best[0]:
            best = (s, name)
    return best[1] if best is not None and best[0] > 0 else None


def feature_slowdown(feature: str, value: float, peer_median: float) -> float | None:
    """One evidence point's slowdown (see the module doc); None where the median is not > 0
    for a relative signal."""
    if feature == "thr":
        return value - peer_median
    if peer_median <= 0:
        return None
    if feature == "step":
        return value / peer_median - 1.0
    if feature == "sm":
        return abs(1.0 - value / peer_median)
    return 1.0 - value / peer_median


def slowdown(findings: Sequence[Mapping[str, Any]], feature: str | None) -> float | None:
    """The mean :func:`feature_slowdown` of ``feature`` over ``findings`` (their ``features``
    evidence); None without a feature or evidence. Bad entries are ignored, never raised."""
    if feature is None:
        return None
    points = []
    for f in findings:
        features = f.get("features") if isinstance(f, Mapping) else None
        for ev in features if isinstance(features, list) else ():
            if not isinstance(ev, Mapping) or ev.get("feature") != feature:
                continue
            value, med = _number(ev.get("value")), _number(ev.get("peer_median"))
            if value is not None and med is not None:
                d = feature_slowdown(feature, value, med)
                if d is not None:
                    points.append(d)
    return sum(points) / len(points) if points else None


def slowdown_text(feature: str | None, value: float | None) -> str:
    """``8.1% slow (SM clock)``, ``throttled 30 points more than its peers``, ``11.0% off (SM
    activity)``; ``slow (its signals)`` without a figure."""
    words = FEATURE_WORDS.get(feature or "", "its signals")
    if value is None:
        return f"slow ({words})"
    if feature == "thr":
        return f"throttled {value * 100:.0f} points more than its peers"
    return f"{value * 100:.1f}% {'off' if feature == 'sm' else 'slow'} ({words})"


def duration_text(seconds: float) -> str:
    """``45 s``, ``18 min``, ``2.5 h``: how long a GPU was slow, for people."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
