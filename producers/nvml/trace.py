"""NVML answers recorded and played back: what a real GPU said, kept to test the agent against.

:class:`RecordingNvml` wraps an :class:`~peerwatch.producers.nvml.device.NvmlApi` (the real
``pynvml`` module) and notes every call made through it: the function, its arguments (device
handles as GPU indexes, GPM samples and event sets as numbers) and the answer (numbers, strings,
pynvml structs as their fields) or the NVML error code. :class:`ReplayNvml` answers the same
calls from such a trace, in the order each (function, arguments) pair was answered, so a sampler
run against it meets exactly what the GPU answered, errors included; a call the trace does not
hold raises :class:`TraceMismatch`. NVML field ids are resolved by name (``NVML_FI_DEV_*``): the
trace keeps the ids the recording binding had, and the replay offers those names only.

The trace is plain JSON (:meth:`RecordingNvml.trace`, :func:`load_trace`): made by
``scripts/record_nvml.py`` on a GPU node, kept under ``tests/data/nvml/``.
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from peerwatch.producers.nvml.reads import FIELD_SPECS
from peerwatch.producers.nvml.xid import handle_key

TRACE_FORMAT = 1

#: The calls whose last argument NVML fills in (recorded after the call, written back on replay).
_FILLED_IN = frozenset({"nvmlGpmMetricsGet"})
#: Calls that hand out an opaque object the trace names by number (kind, function).
_MADE = {
    "nvmlDeviceGetHandleByIndex": "gpu",
    "nvmlGpmSampleAlloc": "gpm_sample",
    "nvmlEventSetCreate": "event_set",
}
#: The pointer type pynvml gives each kind of object (a replay hands out the same types: code
#: under test stores them in pynvml's structs).
_POINTER_TYPES = {
    "gpu": pynvml.c_nvmlDevice_t,
    "gpm_sample": pynvml.c_nvmlGpmSample_t,
    "event_set": pynvml.c_nvmlEventSet_t,
}


class TraceMismatch(AssertionError):
    """A call the trace holds no (more) answers for: the code under test asked NVML something
    the recorded run did not."""


def field_id_names() -> list[str]:
    """Every NVML field-id name the sampler may resolve (``FIELD_SPECS``)."""
    return sorted({n for parts in FIELD_SPECS.values() for alts in parts for n in alts})


# -- encoding ---------------------------------------------------------------------------------------
class _Names:
    """Opaque NVML objects (handles, GPM samples, event sets) by their address, and the number
    each kind gave them."""

    def __init__(self) -> None:
        self._by_key: dict[object, dict[str, Any]] = {}
        self._counts: dict[str, int] = {}

    def add(self, kind: str, obj: Any, number: int | None = None) -> dict[str, Any]:
        if number is None:
            number = self._counts.get(kind, 0)
        self._counts[kind] = max(self._counts.get(kind, 0), number + 1)
        ref = {kind: number}
        self._by_key[handle_key(obj)] = ref
        return ref

    def get(self, obj: Any) -> dict[str, Any] | None:
        if not isinstance(obj, ctypes._Pointer):
            return None
        return self._by_key.get(handle_key(obj))


def _encode(value: Any, names: _Names) -> Any:
    """A JSON-able form of an NVML answer or argument."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return {"bytes": value.decode("latin-1")}
    ref = names.get(value)
    if ref is not None:
        return ref
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v, names) for v in value]}
    if isinstance(value, ctypes.Array):
        return {"list": [_encode(v, names) for v in value]}
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        return {
            "struct": type(value).__name__,
            "fields": {f[0]: _encode(getattr(value, f[0]), names) for f in value._fields_},
        }
    if isinstance(value, ctypes._SimpleCData):
        return _encode(value.value, names)
    if isinstance(value, ctypes._Pointer):
        return {"pointer": type(value).__name__}
    return {"repr": repr(value)}


def _decode(value: Any, objects: Mapping[tuple[str, int], Any]) -> Any:
    """An answer as the code under test reads it: structs as objects with the same attributes."""
    if not isinstance(value, dict):
        return value
    if "bytes" in value:
        return value["bytes"].encode("latin-1")
    if "list" in value:
        return [_decode(v, objects) for v in value["list"]]
    if "struct" in value:
        return SimpleNamespace(**{k: _decode(v, objects) for k, v in value["fields"].items()})
    if len(value) == 1:
        ((kind, number),) = value.items()
        if isinstance(number, int) and (kind, number) in objects:
            return objects[(kind, number)]
    raise ValueError(f"NVML trace: cannot decode {value!r}")


def _filled(struct: Any, names: _Names) -> Any:
    """What NVML wrote into a filled-in struct (GPM metrics: the metrics asked for)."""
    return {"list": [_encode(struct.metrics[i], names) for i in range(int(struct.numMetrics))]}


# -- recording --------------------------------------------------------------------------------------
class RecordingNvml:
    """An NvmlApi that calls ``nvml`` and notes each call (module docstring). Thread-safe: the
    XID watcher's thread and the sampler's share it. Constants are ``nvml``'s."""

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self._names = _Names()
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(target):
            return target

        def call(*args: Any) -> Any:
            return self._call(name, target, args)

        return call

    def _call(self, name: str, target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        with self._lock:
            entry: dict[str, Any] = {
                "fn": name,
                "args": [_encode(a, self._names) for a in args],
                "thread": threading.current_thread().name,
                "t_ms": round((self._clock() - self._t0) * 1000, 3),
            }
        if name in _FILLED_IN:
            entry["args"] = entry["args"][:-1]  # the struct NVML fills in: recorded after
        try:
            result = target(*args)
        except pynvml.NVMLError as exc:
            entry["error"] = int(exc.value)
            with self._lock:
                self.calls.append(entry)
            raise
        with self._lock:
            kind = _MADE.get(name)
            if kind is not None:
                number = args[0] if kind == "gpu" else None
                entry["result"] = self._names.add(kind, result, number)
            elif name in _FILLED_IN:  # it returns the struct it filled in
                entry["filled"] = _filled(args[-1], self._names)
            else:
                entry["result"] = _encode(result, self._names)
            self.calls.append(entry)
        return result

    def trace(self, **meta: Any) -> dict[str, Any]:
        """The trace so far, with ``meta`` (where and how it was recorded)."""
        with self._lock:
            calls = list(self.calls)
        field_ids = {n: getattr(self._nvml, n) for n in field_id_names() if hasattr(self._nvml, n)}
        return {"format": TRACE_FORMAT, "meta": meta, "field_ids": field_ids, "calls": calls}


# -- replay -----------------------------------------------------------------------------------------
def _key(name: str, args: Iterable[Any]) -> str:
    return name + json.dumps(list(args), sort_keys=True)


class ReplayNvml:
    """An NvmlApi answering from a trace (module docstring). Device handles, GPM samples and
    event sets are real ctypes pointers (as pynvml hands out), one per recorded number.
    ``nvmlEventSetWait_v2`` past its recorded answers waits its timeout (at most ``idle_wait_s``)
    and times out, as an idle GPU does."""

    def __init__(self, trace: Mapping[str, Any], idle_wait_s: float = 0.05) -> None:
        if trace.get("format") != TRACE_FORMAT:
            raise ValueError(f"NVML trace: format {trace.get('format')!r}, not {TRACE_FORMAT}")
        self.meta = dict(trace.get("meta") or {})
        self._idle_wait_s = idle_wait_s
        self._lock = threading.Lock()
        self._answers: dict[str, deque[dict[str, Any]]] = {}
        self._objects: dict[tuple[str, int], Any] = {}
        self._buffers: list[Any] = []  # what the objects point at, kept alive
        self._names = _Names()
        calls = trace.get("calls")
        if not isinstance(calls, list):
            raise ValueError("NVML trace: no list of calls")
        for i, entry in enumerate(calls):
            if not (isinstance(entry, dict) and isinstance(entry.get("fn"), str)
                    and isinstance(entry.get("args"), list)):  # fmt: skip
                raise ValueError(f"NVML trace: call {i} lacks its function or arguments")
            self._answers.setdefault(_key(entry["fn"], entry["args"]), deque()).append(entry)
            made = _MADE.get(entry["fn"])
            result = entry.get("result")
            if made is not None and isinstance(result, dict):
                number = result[made]
                if (made, number) not in self._objects:
                    self._buffers.append(ctypes.create_string_buffer(8))
                    obj = ctypes.cast(self._buffers[-1], _POINTER_TYPES[made])
                    self._objects[(made, number)] = obj
                    self._names.add(made, obj, number)
        for name, fid in (trace.get("field_ids") or {}).items():
            setattr(self, name, fid)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML_FI_"):  # a field id the recording binding lacked
            raise AttributeError(name)
        target = getattr(pynvml, name)
        if not name.startswith("nvml") or not callable(target):
            return target  # a constant

        def call(*args: Any) -> Any:
            return self._answer(name, args)

        return call

    def remaining(self) -> dict[str, int]:
        """Answers not asked for yet, by call (the event waits not counted)."""
        with self._lock:
            return {
                k: len(v) for k, v in self._answers.items()
                if v and not k.startswith("nvmlEventSetWait_v2")
            }  # fmt: skip

    def _answer(self, name: str, args: tuple[Any, ...]) -> Any:
        filled = args[-1] if name in _FILLED_IN else None
        shown = args[:-1] if filled is not None else args
        key = _key(name, [_encode(a, self._names) for a in shown])
        with self._lock:
            queue = self._answers.get(key)
            entry = queue.popleft() if queue else None
        if entry is None:
            if name == "nvmlEventSetWait_v2":
                time.sleep(min(self._idle_wait_s, float(args[1]) / 1000.0))
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            raise TraceMismatch(f"NVML trace holds no (more) answers to {key}")
        if "error" in entry:
            raise pynvml.NVMLError(entry["error"])
        if filled is not None:
            for i, metric in enumerate(_decode(entry["filled"], self._objects)):
                target = filled.metrics[i]
                for field_name, value in vars(metric).items():
                    if not isinstance(value, SimpleNamespace | list):
                        setattr(target, field_name, value)
            return filled
        return _decode(entry.get("result"), self._objects)


def load_trace(path: Path) -> dict[str, Any]:
    """A trace written by ``scripts/record_nvml.py`` (JSON)."""
    trace: dict[str, Any] = json.loads(path.read_text())
    return trace
