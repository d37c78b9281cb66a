"""XidWatcher: XIDs reach the callback promptly from the watcher thread; errors do not kill it."""

from __future__ import annotations

import ctypes
import queue
import threading
from typing import Any

import pynvml
import pytest
from fakes import FakeClock, FakeGpu, FakeNvml

from peerwatch.producers.nvml import xid as xid_module
from peerwatch.producers.nvml.sampler import GpuSampler
from peerwatch.producers.nvml.xid import XidBuffer, XidWatcher, handle_key

DEADLINE_S = 2.0


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml([FakeGpu.h100(i) for i in range(4)])
    fake.nvmlInit()
    return fake


@pytest.fixture
def delivered() -> queue.Queue[dict[str, Any]]:
    return queue.Queue()


def _watcher(nvml: FakeNvml, sink: queue.Queue[dict[str, Any]]) -> XidWatcher:
    return XidWatcher(nvml, sink.put, FakeClock(1_700_000_000_000), wait_timeout_ms=20)


def test_xid_delivered_by_the_thread_within_a_bounded_time(
    nvml: FakeNvml, delivered: queue.Queue[dict[str, Any]]
) -> None:
    watcher = _watcher(nvml, delivered)
    assert watcher.start() == [0, 1, 2, 3]
    try:
        nvml.inject_xid(2, 48)
        event = delivered.get(timeout=DEADLINE_S)
        assert event == {"gpu_index": 2, "xid": 48, "ts_ms": 1_700_000_000_000, "event_data": None}
        assert threading.current_thread() is threading.main_thread()
    finally:
        watcher.stop()
    assert not watcher.running
    assert nvml.count("nvmlEventSetFree") == 1


def test_stop_is_prompt_when_idle(nvml: FakeNvml, delivered: queue.Queue[dict[str, Any]]) -> None:
    watcher = _watcher(nvml, delivered)
    watcher.start()
    watcher.stop(timeout_s=DEADLINE_S)
    assert not watcher.running
    assert delivered.empty()
    assert nvml.count("nvmlEventSetWait_v2") >= 1


def test_gpus_without_xid_support_are_skipped(delivered: queue.Queue[dict[str, Any]]) -> None:
    nvml = FakeNvml([FakeGpu.h100(0, supported_events=0), FakeGpu.h100(1)])
    nvml.nvmlInit()
    watcher = _watcher(nvml, delivered)
    assert watcher.start() == [1]
    watcher.stop()
    assert nvml.count("nvmlDeviceRegisterEvents", 0) == 0


def test_nothing_to_watch_starts_no_thread(delivered: queue.Queue[dict[str, Any]]) -> None:
    nvml = FakeNvml([FakeGpu.h100(0, supported_events=0)])
    nvml.nvmlInit()
    watcher = _watcher(nvml, delivered)
    assert watcher.start() == []
    assert not watcher.running
    assert nvml.count("nvmlEventSetFree") == 1


def test_event_set_failure_is_logged_not_raised(delivered: queue.Queue[dict[str, Any]]) -> None:
    nvml = FakeNvml([FakeGpu.h100()])  # never initialised: every call is Uninitialized
    watcher = _watcher(nvml, delivered)
    assert watcher.start() == []
    assert not watcher.running


def test_lost_gpu_xid_79_still_mapped_to_its_index(
    nvml: FakeNvml, delivered: queue.Queue[dict[str, Any]]
) -> None:
    watcher = _watcher(nvml, delivered)
    watcher.start()
    try:
        nvml.lose_gpu(3, xid=79)
        event = delivered.get(timeout=DEADLINE_S)
    finally:
        watcher.stop()
    assert (event["gpu_index"], event["xid"]) == (3, 79)


def test_callback_exception_does_not_kill_the_thread(nvml: FakeNvml) -> None:
    got: queue.Queue[int] = queue.Queue()

    def callback(event: dict[str, Any]) -> None:
        got.put(event["xid"])
        if event["xid"] == 13:
            raise RuntimeError("publisher down")

    watcher = XidWatcher(nvml, callback, FakeClock(), wait_timeout_ms=20)
    watcher.start()
    try:
        nvml.inject_xid(0, 13)
        assert got.get(timeout=DEADLINE_S) == 13
        nvml.inject_xid(0, 94)
        assert got.get(timeout=DEADLINE_S) == 94
        assert watcher.running
    finally:
        watcher.stop()


def test_wait_errors_back_off_and_recover(
    nvml: FakeNvml, delivered: queue.Queue[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xid_module, "_ERROR_BACKOFF_S", 0.01)
    real_wait = nvml.nvmlEventSetWait_v2
    failures = iter([pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_GPU_IS_LOST])

    def flaky_wait(event_set: Any, timeout_ms: int) -> Any:
        code = next(failures, None)
        if code is not None:
            raise pynvml.NVMLError(code)
        return real_wait(event_set, timeout_ms)

    monkeypatch.setattr(nvml, "nvmlEventSetWait_v2", flaky_wait)
    watcher = _watcher(nvml, delivered)
    watcher.start()
    try:
        nvml.inject_xid(1, 74)
        assert delivered.get(timeout=DEADLINE_S)["xid"] == 74
    finally:
        watcher.stop()


def test_buffer_feeds_the_next_sample(
    nvml: FakeNvml, delivered: queue.Queue[dict[str, Any]]
) -> None:
    buffer = XidBuffer()
    published: list[dict[str, Any]] = []

    def on_xid(event: dict[str, Any]) -> None:
        published.append(event)  # the agent publishes at once ...
        buffer.add(event)  # ... and the next sample carries it too
        delivered.put(event)

    watcher = XidWatcher(nvml, on_xid, FakeClock(), wait_timeout_ms=20)
    watcher.start()
    try:
        nvml.inject_xid(0, 48)
        delivered.get(timeout=DEADLINE_S)
    finally:
        watcher.stop()
    sampler = GpuSampler(nvml, "n1", 1000, FakeClock())
    record = sampler.sample(0, xids=buffer.drain())
    assert [x["xid"] for x in record["xids"]] == [48] and published == record["xids"]
    assert sampler.sample(1, xids=buffer.drain())["xids"] == []


def test_handle_key_uses_the_address_of_real_handles() -> None:
    buf = ctypes.create_string_buffer(8)
    a = ctypes.cast(buf, pynvml.c_nvmlDevice_t)
    b = ctypes.cast(buf, pynvml.c_nvmlDevice_t)
    assert a is not b and handle_key(a) == handle_key(b)
    opaque = object()
    assert handle_key(opaque) == handle_key(opaque) != handle_key(object())
