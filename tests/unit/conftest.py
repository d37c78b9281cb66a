"""Unit tests start no process and open no network connection: enforce it. A test that runs a
CLI command in-process leaves the collector's thresholds as it found them (the stream and replay
commands tune them, peerwatch/gc_tuning.py)."""

from __future__ import annotations

import gc
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


def _refuse(*_: Any, **__: Any) -> None:
    raise AssertionError("unit tests must not start processes or open network connections")


@pytest.fixture(autouse=True)
def _no_processes_or_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse)
    real_connect = socket.socket.connect

    def guarded_connect(self: socket.socket, address: Any) -> Any:
        if self.family == socket.AF_UNIX:
            return real_connect(self, address)
        return _refuse()

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", lambda *a, **k: _refuse())


@pytest.fixture(autouse=True)
def _gc_thresholds_restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``os.fsync`` is called on from now, in order (each call still syncs)."""
    import os

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced
