"""Running Slurm's commands: the one runner of the watcher, the hooks and the drain controller.

Commands are argument vectors, never a shell, with stdin closed and a timeout each. Output is read
as bytes and decoded as UTF-8 with ``errors="replace"``: job names, comments and node reasons are
user text, and a byte that is not UTF-8 becomes U+FFFD instead of an exception (U+FFFD, unlike a
surrogate escape, can still be encoded into a record). Every failure becomes
:class:`~peerwatch.errors.SlurmCommandError`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerwatch.errors import SlurmCommandError
from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["CommandResult", "Runner", "SlurmCommands", "decode_output", "run_command"]


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


#: Runs an argument vector with a timeout (seconds). Raises OSError or subprocess.TimeoutExpired.
Runner = Callable[[Sequence[str], float], CommandResult]


def decode_output(data: bytes) -> str:
    """Command output as text: UTF-8, each undecodable byte replaced by U+FFFD."""
    return data.decode("utf-8", errors="replace")


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """The real :data:`Runner`: ``subprocess.run`` without a shell, stdin closed, bytes decoded
    by :func:`decode_output`."""
    proc = subprocess.run(
        list(argv), capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL, check=False
    )
    return CommandResult(proc.returncode, decode_output(proc.stdout), decode_output(proc.stderr))


class SlurmCommands:
    """The Slurm commands in ``bin_dir`` (``None``: from ``$PATH``), each bounded by ``timeout_s``.

    No process is started before the first call."""

    def __init__(
        self,
        bin_dir: str | Path | None = None,
        timeout_s: float = 30.0,
        runner: Runner = run_command,
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self.timeout_s = timeout_s
        self._runner = runner

    def _argv(self, command: str, *args: str) -> list[str]:
        return [str(self.bin_dir / command) if self.bin_dir else command, *args]

    def run(self, command: str, *args: str) -> str:
        """stdout of ``command args``. Raises SlurmCommandError."""
        argv = self._argv(command, *args)
        shown = " ".join(argv)
        try:
            result = self._runner(argv, self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise SlurmCommandError(
                f"`{shown}` did not finish within {self.timeout_s:g} s"
            ) from exc
        except OSError as exc:
            raise SlurmCommandError(f"cannot run `{shown}`: {exc.strerror or exc}") from exc
        if result.returncode != 0:
            why = result.stderr.strip().splitlines()[-1:] or ["no message"]
            raise SlurmCommandError(f"`{shown}` exited {result.returncode}: {why[0][:300]}")
        return result.stdout

    def run_json(self, command: str, *args: str) -> dict[str, Any]:
        """``command args`` parsed as a JSON object. Raises SlurmCommandError, SlurmParseError."""
        text = self.run(command, *args)
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested beyond any need
            raise SlurmParseError(f"`{command} {' '.join(args)}` printed no JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise SlurmParseError(f"`{command} {' '.join(args)}` printed {type(doc).__name__}")
        return doc
