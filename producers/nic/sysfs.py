"""The narrow sysfs interface and the parsers of what it hands back.

``SysfsApi`` is the three calls peerwatch makes on a sysfs tree; ``SysfsTree`` is the real one,
rooted at a configurable directory (``/sys`` in production, a recorded tree under
``tests/data/sysfs/`` in tests and the simulator). Paths are relative to the root and use the
kernel's names (``class/infiniband/mlx5_0/ports/1/counters/symbol_error``).

Every file is hostile input: a missing or unreadable file, garbage, a number beyond a signed
64-bit long, text that is not ASCII, or a file longer than a page all give None from the parsers
(``ReadStats`` counts why); nothing here raises out of a read.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

#: Paths whose first failure is logged (each once); past this many, failures are only counted.
MAX_LOGGED_PATHS = 256
#: sysfs attributes are at most one page; anything longer is not a sysfs value.
MAX_READ_BYTES = 4096
#: The largest value an Avro long holds; a counter above it is published as null.
MAX_LONG = (1 << 63) - 1

_DIGITS = re.compile(rb"[0-9]{1,20}")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_ ]{0,31}")
_RATE = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,3})?) Gb/sec")


class SysfsApi(Protocol):
    """What peerwatch asks of a sysfs tree. Each call raises OSError for a path it cannot serve."""

    def read(self, path: str) -> bytes:
        """Up to ``MAX_READ_BYTES + 1`` bytes of the file at ``path``."""
        ...

    def listdir(self, path: str) -> list[str]:
        """The entry names of directory ``path`` (any order)."""
        ...

    def realpath(self, path: str) -> str:
        """``path`` with every symlink resolved, relative to the root (``""`` when it escapes)."""
        ...


class SysfsTree:
    """The real sysfs (or a recorded copy of it) under ``root``."""

    def __init__(self, root: Path | str = "/sys") -> None:
        self.root = Path(root)
        self._root_real = os.path.realpath(self.root)

    def read(self, path: str) -> bytes:
        # O_NONBLOCK: a FIFO or a device where an attribute should be must not block the tick.
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(os.path.join(self._root_real, path), flags)
        try:
            return os.read(fd, MAX_READ_BYTES + 1)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(os.path.join(self._root_real, path))

    def realpath(self, path: str) -> str:
        real = os.path.realpath(os.path.join(self._root_real, path))
        if real != self._root_real and not real.startswith(self._root_real + os.sep):
            return ""
        return os.path.relpath(real, self._root_real)


@dataclass
class ReadStats:
    """Why reads gave null, since the reader started (the agent publishes the total per tick)."""

    missing: int = 0
    unreadable: int = 0
    garbage: int = 0
    too_large: int = 0

    @property
    def total(self) -> int:
        return self.missing + self.unreadable + self.garbage + self.too_large


class Reader:
    """Reads and parses sysfs values through a ``SysfsApi``, counting every failure in
    ``stats``. Methods return None for any bad value and never raise."""

    def __init__(self, tree: SysfsApi) -> None:
        self.tree = tree
        self.stats = ReadStats()
        self._logged: set[str] = set()

    def _bad(self, path: str, why: str) -> None:
        """Count one failure of ``path`` (``why``: a ReadStats field) and log its first one."""
        setattr(self.stats, why, getattr(self.stats, why) + 1)
        if path not in self._logged and len(self._logged) < MAX_LOGGED_PATHS:
            self._logged.add(path)
            # ascii(): a hostile tree may name a folder with terminal escapes.
            log.warning("sysfs %s: %s; published as null (logged once)", ascii(path), why)

    def raw(self, path: str) -> bytes | None:
        """The file's bytes, or None (missing, unreadable, longer than a page)."""
        try:
            data = self.tree.read(path)
        except FileNotFoundError:
            self._bad(path, "missing")
            return None
        except (OSError, ValueError):
            # EINVAL (netdev speed of a down link), EACCES, EIO from a dying HCA, a NUL in a path.
            self._bad(path, "unreadable")
            return None
        if len(data) > MAX_READ_BYTES:
            self._bad(path, "too_large")
            return None
        return data

    def counter(self, path: str) -> int | None:
        """A non-negative decimal integer that fits an Avro long, else None."""
        data = self.raw(path)
        if data is None:
            return None
        text = data.strip()
        if not _DIGITS.fullmatch(text):
            self._bad(path, "garbage")
            return None
        value = int(text)
        if value > MAX_LONG:
            self._bad(path, "too_large")
            return None
        return value

    def integer(self, path: str) -> int | None:
        """A decimal integer, possibly negative (``numa_node`` -1, netdev ``speed`` -1)."""
        data = self.raw(path)
        if data is None:
            return None
        text = data.strip()
        negative = text.startswith(b"-")
        if not _DIGITS.fullmatch(text[1:] if negative else text):
            self._bad(path, "garbage")
            return None
        value = int(text)
        if abs(value) > MAX_LONG:
            self._bad(path, "too_large")
            return None
        return value

    def text(self, path: str) -> str | None:
        """Short ASCII text (``ACTIVE``, ``InfiniBand``, ``up``); the kernel's numeric prefix
        (``4: ACTIVE``) is dropped. Anything else is None."""
        data = self.raw(path)
        if data is None:
            return None
        try:
            value = data.decode("ascii").strip()
        except UnicodeDecodeError:
            self._bad(path, "garbage")
            return None
        if ":" in value:
            value = value.split(":", 1)[1].strip()
        if not _WORD.fullmatch(value):
            self._bad(path, "garbage")
            return None
        return value

    def ib_rate_gbps(self, path: str) -> float | None:
        """An IB port ``rate`` (``400 Gb/sec (4X NDR)``) in Gb/s."""
        data = self.raw(path)
        if data is None:
            return None
        try:
            match = _RATE.match(data.decode("ascii").strip())
        except UnicodeDecodeError:
            match = None
        if match is None:
            self._bad(path, "garbage")
            return None
        return float(match.group(1))
