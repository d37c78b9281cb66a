"""Output paths a command writes at the end of its work (``replay --report``/``--findings``,
``job --html``, ``archive --dir``), checked before the work starts: a path that cannot be
written is a :class:`~peerwatch.errors.ConfigError` naming the option, at once, not a traceback
after an hour of replay.

The checks try what the command will do (open the file for writing, create a file in the
folder), so they hold for root (who passes every permission bit), read-only file systems,
missing folders and paths that are folders. A file the check creates is removed again: a
command that fails later leaves nothing behind.
"""

from __future__ import annotations

import os
from pathlib import Path

from peerwatch.errors import ConfigError

__all__ = ["check_output_dir", "check_output_file", "write_output"]


def _why(exc: OSError | ValueError) -> str:
    if isinstance(exc, ValueError):  # a NUL in the path, and the like
        return str(exc)
    return exc.strerror or str(exc)


def check_output_file(path: str, option: str) -> Path:
    """``path`` as a Path once it is known to be writable as a file. Raises ConfigError naming
    ``option`` (and why) when it is a folder, its folder is missing, or it cannot be written."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(option, f"{path} is a directory, not a file")
    existed = out.exists()
    try:
        with open(out, "a"):
            pass
    except (OSError, ValueError) as exc:
        raise ConfigError(option, f"cannot write {path}: {_why(exc)}") from exc
    if not existed:
        out.unlink(missing_ok=True)
    return out


def check_output_dir(path: str, option: str) -> Path:
    """``path`` as a Path once it is a folder (created if missing) a file can be created in.
    Raises ConfigError naming ``option`` (and why) otherwise."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".peerwatch-write-check.{os.getpid()}"
        with open(probe, "w"):
            pass
        probe.unlink()
    except (OSError, ValueError) as exc:
        raise ConfigError(option, f"cannot write in {path}: {_why(exc)}") from exc
    return out


def write_output(path: Path, text: str, option: str) -> None:
    """Write ``text`` to ``path`` (checked before the work, see :func:`check_output_file`);
    a failure now (a full disk) is a ConfigError naming ``option``, not a traceback."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise ConfigError(option, f"cannot write {path}: {_why(exc)}") from exc
