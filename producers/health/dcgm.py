"""``dcgmi diag -r <level> -j``: run through an injected runner, parse pass / warn / fail.

The JSON layout changed across DCGM releases (top key "DCGM GPU Diagnostic" in 2.x/3.x,
"DCGM Diagnostic" later; results nested under test_categories -> tests -> results), so the parser
walks the document for every ``status`` value instead of relying on one layout. Text output (no
JSON) falls back to the table's ``Pass`` / ``Warn`` / ``Fail`` cells.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from peerwatch.producers.health.outcome import CRITICAL, OK, STATUSES, WARNING, outcome


@dataclass(frozen=True)
class CommandResult:
    """Exit code and output of one command."""

    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs an argument vector (never a shell) with a timeout in seconds."""

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult: ...


Which = Callable[[str], str | None]


def subprocess_runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """The real runner. A timeout or a missing binary is returned as exit code 124 / 127."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"timed out after {timeout_s:.0f} s")
    except OSError as exc:
        return CommandResult(127, "", str(exc))
    return CommandResult(done.returncode, done.stdout, done.stderr)


def _statuses(doc: Any, test: str = "") -> Iterator[tuple[str, str]]:
    """(test label, status) for every ``status`` string in the document; the label is the
    nearest enclosing ``name`` plus the GPU id where the result carries one."""
    if isinstance(doc, dict):
        if isinstance(doc.get("name"), str):
            test = doc["name"]
        status = doc.get("status")
        if isinstance(status, str):
            gpu = doc.get("gpu_id", doc.get("entity_id"))
            yield (f"{test} (GPU {gpu})" if gpu is not None else test or "diag"), status
        for key, value in doc.items():
            if key != "status":
                yield from _statuses(value, test)
    elif isinstance(doc, list):
        for item in doc:
            yield from _statuses(item, test)


_TEXT_CELL = re.compile(r"^\|\s*(?P<test>[^|]+?)\s*\|\s*(?P<status>Pass|Fail|Warn|Skip)\b", re.M)


def parse_diag(stdout: str) -> list[tuple[str, str]]:
    """(test, status) pairs from ``dcgmi diag`` output, JSON or text; empty if none found."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return [(m["test"], m["status"]) for m in _TEXT_CELL.finditer(stdout)]
    return list(_statuses(doc))


#: Status of a ``dcgmi diag`` that could not run (nv-hostengine down, timeout, no output): a
#: WARNING, so the monitor's own missing tool never drains the node (Slurm drains on a non-zero
#: prolog/epilog, and a WARNING exits 0 there); a fault found by a test is still CRITICAL.
DEFAULT_UNAVAILABLE_STATUS = WARNING


def check_dcgm_diag(
    runner: Runner,
    level: int,
    *,
    binary: str = "dcgmi",
    timeout_s: float = 900.0,
    unavailable_status: str = DEFAULT_UNAVAILABLE_STATUS,
) -> list[dict[str, Any]]:
    """Run ``<binary> diag -r <level> -j`` (``timeout_s`` in seconds) and turn its verdict into
    one outcome.

    Any failed test is CRITICAL, any warning WARNING, all passed (or skipped) OK. Output with no
    test status in it (dcgmi could not run: host engine down, timed out) is ``unavailable_status``
    (WARNING by default), with the exit code and the last line of stderr. Raises ValueError for
    an ``unavailable_status`` that is not a Nagios status.
    """
    if unavailable_status not in STATUSES:
        raise ValueError(f"unknown health status {unavailable_status!r}")
    argv = [binary, "diag", "-r", str(level), "-j"]
    result = runner(argv, timeout_s)
    pairs = parse_diag(result.stdout)
    if not pairs:
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
        msg = f"dcgmi diag -r {level} could not run (exit {result.returncode}) {detail[0]}"
        return [outcome("dcgm_diag", unavailable_status, msg.strip())]
    failed = sorted({t for t, s in pairs if s.lower().startswith("fail")})
    warned = sorted({t for t, s in pairs if s.lower().startswith("warn")})
    if failed:
        return [
            outcome("dcgm_diag", CRITICAL, f"dcgmi diag -r {level} failed: {', '.join(failed)}")
        ]
    if warned:
        return [outcome("dcgm_diag", WARNING, f"dcgmi diag -r {level} warned: {', '.join(warned)}")]
    return [outcome("dcgm_diag", OK, f"dcgmi diag -r {level}: {len(pairs)} results, all passed")]
