"""What the detector reads of one job window's GpuWindows, as columns in the windows' order.

The detector (:func:`~peerwatch.streams.core.detector.detect_job_window`) reads a few fields of
every window of a job (whether it reports, whether a hard rule may fire, the compared features)
and the rest only for the few windows that make a finding. :class:`WindowColumns` holds those few
fields as arrays. Two makers, one set of rules:

* :func:`of_windows`: from the GpuWindow dicts themselves (windows decoded from Kafka, tests);
* the window aggregator (:meth:`~peerwatch.streams.core.windows.ClosedWindows.by_job`), from the
  same accumulator arrays it makes the dicts' values from, so a replay never reads them back
  out of the dicts it just filled.

Both pass their arrays through :func:`reporting` and :func:`may_fire_columns` (the rules), and
give a float field as a :class:`FloatColumn` (NaN where the window holds None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from peerwatch.schemas.records import GpuWindow
from peerwatch.streams.core.hard_rules import MAY_FIRE_BELOW, MAY_FIRE_FIELDS
from peerwatch.streams.core.model import field_rows

#: The float fields the detector compares across peers (and its gate reads).
FLOAT_FIELDS = ("clk_ratio", "throttle_frac", "sm_frac", "step_ms", "power_ratio")


class FloatColumn(NamedTuple):
    """One float field of every window: ``values`` (NaN where the window holds None) and
    ``nan_given`` (where a window holds a NaN itself, not None; None when none does)."""

    values: np.ndarray
    nan_given: np.ndarray | None

    def take(self, rows: np.ndarray) -> FloatColumn:
        """The column of the windows ``rows`` only."""
        return FloatColumn(
            self.values[rows], None if self.nan_given is None else self.nan_given[rows]
        )

    def present(self) -> list[float]:
        """The values the windows hold (not None), in order: a NaN given stays."""
        x = self.values
        keep = ~np.isnan(x)
        if self.nan_given is not None:
            keep |= self.nan_given
        out: list[float] = x[keep].tolist()
        return out


def float_column(raw: Sequence[Any]) -> FloatColumn:
    """A :class:`FloatColumn` from one field's values of every window (None: absent)."""
    x = np.array(raw, dtype=np.float64)
    nan = np.isnan(x)
    if not nan.any():
        return FloatColumn(x, None)
    given = nan & np.fromiter((v is not None for v in raw), np.bool_, len(raw))
    return FloatColumn(x, given if given.any() else None)


def from_arrays(values: np.ndarray, present: np.ndarray) -> FloatColumn:
    """A :class:`FloatColumn` from computed values and where they are known (elsewhere the
    window holds None)."""
    x = np.where(present, values, np.nan)
    given = present & np.isnan(values)
    return FloatColumn(x, given if given.any() else None)


def reporting(lost: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """Whether each window holds readings of a GPU that is not lost (``lost``: bool,
    ``samples``: readings, 0 where None)."""
    out: np.ndarray = ~lost & (samples > 0)
    return out


def may_fire_columns(
    flags: Sequence[np.ndarray], below: Sequence[tuple[np.ndarray, np.ndarray]], n: int
) -> np.ndarray:
    """False for each of ``n`` windows where no hard rule can fire (most windows): none of
    ``flags`` (the truth of :data:`~peerwatch.streams.core.hard_rules.MAY_FIRE_FIELDS`: XIDs
    seen, counter deltas, condition flags) is set and no (min, max) pair of ``below`` (float,
    NaN where None; :data:`~peerwatch.streams.core.hard_rules.MAY_FIRE_BELOW`) has min < max."""
    out = np.zeros(n, np.bool_)
    for f in flags:
        out |= f
    with np.errstate(invalid="ignore"):
        for low, high in below:
            out |= low < high  # NaN (None) compares False
    return out


def _truthy(values: Sequence[Any]) -> np.ndarray:
    return np.fromiter(map(bool, values), np.bool_, len(values))


@dataclass
class WindowColumns:
    """The columns of one job window, in the order of its windows: the GPU ``keys``, whether
    each window ``reports`` and whether a hard rule ``fires`` on it (may fire: see
    :func:`may_fire_columns`), and float fields by name (:meth:`column`; read from the dicts on
    first use when not given)."""

    keys: list[str]
    reports: np.ndarray
    fires: np.ndarray
    floats: dict[str, FloatColumn] = field(default_factory=dict)
    #: reads one float field of every window (absent fields of :func:`of_windows`)
    read: Callable[[str], FloatColumn] | None = None

    def column(self, name: str) -> FloatColumn:
        got = self.floats.get(name)
        if got is None:
            if self.read is None:
                raise KeyError(name)
            got = self.floats[name] = self.read(name)
        return got

    def set_float(self, name: str, windows: Sequence[GpuWindow]) -> None:
        """Read ``name`` again from ``windows`` (the same windows, after a change)."""
        self.floats[name] = float_column(field_rows(windows, name))


def of_windows(
    windows: Sequence[GpuWindow], keys: list[str], lost: Sequence[Any], samples: Sequence[Any]
) -> WindowColumns:
    """The columns of GpuWindow dicts (``keys``, ``lost`` and ``samples``: already read)."""
    reports = reporting(_truthy(lost), np.fromiter((int(s or 0) for s in samples), np.int64))
    pairs = [f for pair in MAY_FIRE_BELOW for f in pair]
    rows = field_rows(windows, *MAY_FIRE_FIELDS, *pairs)
    cols = list(zip(*rows, strict=True)) if rows else [()] * (len(MAY_FIRE_FIELDS) + len(pairs))
    flags = [_truthy(c) for c in cols[: len(MAY_FIRE_FIELDS)]]
    floats = [np.array(c, dtype=np.float64) for c in cols[len(MAY_FIRE_FIELDS) :]]
    fires = may_fire_columns(flags, list(zip(floats[::2], floats[1::2], strict=True)), len(rows))

    def read(name: str) -> FloatColumn:
        return float_column(field_rows(windows, name))

    return WindowColumns(keys, reports, fires, read=read)
