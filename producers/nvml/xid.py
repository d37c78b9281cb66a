"""XID critical-error events: a thread blocked in ``nvmlEventSetWait_v2`` hands each one on at once.

The agent's callback publishes the XidEvent immediately and also puts it in an ``XidBuffer`` that
the next NodeGpuSample drains into its ``xids`` array.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from peerwatch.clock import Clock
from peerwatch.producers.nvml.device import NvmlApi, is_unsupported
from peerwatch.schemas.records import XidEvent

log = logging.getLogger(__name__)

XidCallback = Callable[[XidEvent], None]

# After an NVML error other than the idle timeout, wait this long before waiting again, so a
# broken event set does not spin a core.
_ERROR_BACKOFF_S = 1.0


def handle_key(handle: Any) -> object:
    """A hashable identity for a device handle.

    Real handles are ctypes pointers, and NVML returns a new pointer object for the same device on
    every call, so the pointed-to address is the identity; fakes' opaque objects use ``id``.
    """
    try:
        addr = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return ("id", id(handle))
    return ("addr", addr)


class XidBuffer:
    """Thread-safe list of XidEvent dicts seen since the last ``drain``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[XidEvent] = []

    def add(self, event: XidEvent) -> None:
        with self._lock:
            self._events.append(event)

    def drain(self) -> list[XidEvent]:
        """Return and forget every event added since the previous drain, oldest first."""
        with self._lock:
            events, self._events = self._events, []
        return events


class XidWatcher:
    """Watches every GPU's XID critical errors on a daemon thread.

    ``start()`` creates the event set and registers the GPUs (synchronously, so the caller learns
    which GPUs are watched); the thread then waits ``wait_timeout_ms`` at a time so ``stop()``
    returns within about that long. NVML errors and callback exceptions are logged, never raised.
    """

    def __init__(
        self,
        nvml: NvmlApi,
        callback: XidCallback,
        clock: Clock,
        *,
        wait_timeout_ms: int = 500,
    ) -> None:
        self._nvml = nvml
        self._callback = callback
        self._clock = clock
        self._wait_timeout_ms = wait_timeout_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._index_by_handle: dict[object, int] = {}
        self.registered: list[int] = []

    def start(self) -> list[int]:
        """Create the event set, register XID events on every GPU that supports them, start the
        thread. Returns the indices of the registered GPUs (empty: nothing to watch, no thread).
        ``nvmlInit`` must have been called. Never raises for NVML errors."""
        if self._thread is not None:
            return self.registered
        try:
            self._event_set = self._nvml.nvmlEventSetCreate()
            count = self._nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            log.error("XID watcher disabled: cannot create the NVML event set: %s", exc)
            self._free_set()
            return []
        for index in range(count):
            self._register(index)
        if not self.registered:
            log.warning("XID watcher: no GPU supports XID events; not watching")
            self._free_set()
            return []
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="peerwatch-xid", daemon=True)
        self._thread.start()
        return self.registered

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the thread to stop and wait for it (default: two wait timeouts plus a second)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(
                timeout_s if timeout_s is not None else 2 * self._wait_timeout_ms / 1000 + 1
            )
            if thread.is_alive():
                log.warning("XID watcher thread did not stop in time")
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _register(self, index: int) -> None:
        xid_type = pynvml.nvmlEventTypeXidCriticalError
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            supported = self._nvml.nvmlDeviceGetSupportedEventTypes(handle)
            if not supported & xid_type:
                log.info("GPU %d: XID events not supported", index)
                return
            self._nvml.nvmlDeviceRegisterEvents(handle, xid_type, self._event_set)
        except pynvml.NVMLError as exc:
            level = logging.INFO if is_unsupported(exc) else logging.WARNING
            log.log(level, "GPU %d: cannot register XID events: %s", index, exc)
            return
        self._index_by_handle[handle_key(handle)] = index
        self.registered.append(index)

    def _gpu_index(self, device: Any) -> int:
        index = self._index_by_handle.get(handle_key(device))
        if index is not None:
            return index
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except pynvml.NVMLError as exc:
            log.warning("XID on an unknown device handle (%s); reporting gpu_index -1", exc)
            return -1

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    data = self._nvml.nvmlEventSetWait_v2(self._event_set, self._wait_timeout_ms)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    log.warning("nvmlEventSetWait_v2 failed: %s", exc)
                    self._stop.wait(_ERROR_BACKOFF_S)
                    continue
                self._deliver(data)
        except Exception:
            log.exception("XID watcher thread died")
        finally:
            self._free_set()

    def _deliver(self, data: Any) -> None:
        if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
            return
        event: XidEvent = {
            "gpu_index": self._gpu_index(data.device),
            "xid": int(data.eventData),
            "ts_ms": self._clock.now_ms(),
            # nvmlEventSetWait_v2 carries nothing beyond the XID code in eventData.
            "event_data": None,
        }
        try:
            self._callback(event)
        except Exception:
            log.exception("XID callback failed for %s", event)

    def _free_set(self) -> None:
        if self._event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(self._event_set)
        except pynvml.NVMLError as exc:
            log.debug("nvmlEventSetFree: %s", exc)
        self._event_set = None
