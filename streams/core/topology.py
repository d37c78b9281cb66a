"""The switch layout from Slurm: which leaf switch each node hangs from.

Two sources, one line per switch, ``key=value`` tokens separated by blanks:

* ``scontrol show topology`` (Slurm's topology/tree plugin, ``_print_topo_record``):
  ``SwitchName=s0 Level=0 LinkSpeed=1 Nodes=gpu[001-032]`` and, above the leaves,
  ``SwitchName=s2 Level=1 LinkSpeed=1 Switches=s[0-1]``. ``SLURM_TOPO_LEN`` may cut a line
  short, so a hostlist can end mid-bracket: such a line is skipped and reported.
* ``topology.conf``: ``SwitchName=leaf01 Nodes=gpu[001-032]`` / ``SwitchName=spine Switches=leaf[01-02]``
  with ``#`` comments (no ``Level``: a switch with ``Nodes`` is a leaf).

Slurm output is hostile input: a line that does not parse (no ``SwitchName``, a name outside
``[A-Za-z0-9._-]``, a bad hostlist, a bad number) is skipped and its problem kept, with the text
shortened and ascii-escaped; a node listed under two leaf switches stays under the first.
Nothing here raises on the text; :func:`read_topology` raises only what running the command
raises.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from peerwatch.errors import ConfigError, SlurmCommandError
from peerwatch.producers.slurm.command import SlurmCommands
from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.hostlist import expand

log = logging.getLogger(__name__)

#: A switch name we accept (Slurm's own names are identifiers; anything else is refused).
NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
#: The longest line read (longer lines are cut by Slurm or hostile).
MAX_LINE = 1 << 16
MAX_SWITCHES = 100_000
#: The largest topology file read (100,000 switch lines of a few hundred bytes fit).
MAX_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class Switch:
    """One switch: ``level`` (0 for a leaf; None when the source does not say), ``link_speed``
    (Slurm's relative number, None when absent), the ``nodes`` directly under it and the child
    ``switches``."""

    name: str
    level: int | None
    link_speed: int | None
    nodes: tuple[str, ...]
    switches: tuple[str, ...]

    @property
    def is_leaf(self) -> bool:
        """A switch with nodes directly under it."""
        return bool(self.nodes)


@dataclass(frozen=True)
class Topology:
    """The parsed layout: every switch by name, each node's leaf switch, and the problems of
    the lines that were skipped (for the caller to count and log)."""

    switches: Mapping[str, Switch] = field(default_factory=dict)
    leaf_of: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def leaf(self, node: str) -> str | None:
        """The leaf switch of ``node`` (None: not in the topology)."""
        return self.leaf_of.get(node)

    def nodes_under(self, switch: str) -> tuple[str, ...]:
        """The nodes directly under ``switch`` (empty for an unknown or non-leaf switch)."""
        sw = self.switches.get(switch)
        return sw.nodes if sw is not None else ()

    def groups(self, nodes: Iterable[str]) -> dict[str | None, list[str]]:
        """``nodes`` grouped by leaf switch (key None: nodes the topology does not place);
        each list sorted."""
        out: dict[str | None, list[str]] = {}
        for node in sorted(set(nodes)):
            out.setdefault(self.leaf(node), []).append(node)
        return out


def _shown(line: str) -> str:
    """A line for a message: at most 80 characters, ascii-escaped."""
    return ascii(line[:80] + ("..." if len(line) > 80 else ""))


def _escaped(text: str) -> str:
    """``text`` with every non-printable or non-ASCII character backslash-escaped."""
    return text.encode("unicode_escape").decode("ascii")


def _number(value: str | None, key: str) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or len(value) > 9:
        raise SlurmParseError(f"{key}={value!r} is not a small non-negative integer")
    return int(value)


def _names(value: str | None, what: str) -> tuple[str, ...]:
    if not value or value == "(null)":
        return ()
    names = expand(value)
    for name in names:
        if not NAME.fullmatch(name):
            raise SlurmParseError(f"{what} name {name!r} has characters outside [A-Za-z0-9._-]")
    return tuple(names)


def _switch(line: str) -> Switch:
    """One switch line. Raises SlurmParseError."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if not sep:
            raise SlurmParseError(f"token {token!r} is not key=value")
        if key in fields:
            raise SlurmParseError(f"{key} given twice")
        fields[key] = value
    name = fields.get("SwitchName")
    if name is None:
        raise SlurmParseError("no SwitchName")
    if not NAME.fullmatch(name):
        raise SlurmParseError(f"switch name {name!r} has characters outside [A-Za-z0-9._-]")
    return Switch(
        name,
        _number(fields.get("Level"), "Level"),
        _number(fields.get("LinkSpeed"), "LinkSpeed"),
        _names(fields.get("Nodes"), "node"),
        _names(fields.get("Switches"), "switch"),
    )


def parse_topology(text: str) -> Topology:
    """Parse ``scontrol show topology`` output or a ``topology.conf``. Never raises: lines that
    do not parse are skipped and listed in :attr:`Topology.problems`."""
    switches: dict[str, Switch] = {}
    leaf_of: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line) > MAX_LINE:
            problems.append(f"line {number}: longer than {MAX_LINE} characters")
            continue
        if len(switches) >= MAX_SWITCHES:
            problems.append(f"line {number}: more than {MAX_SWITCHES} switches, the rest skipped")
            break
        try:
            sw = _switch(line)
        except SlurmParseError as exc:
            problems.append(f"line {number}: {_escaped(str(exc))} in {_shown(line)}")
            continue
        if sw.name in switches:
            problems.append(f"line {number}: switch {sw.name} listed again, skipped")
            continue
        switches[sw.name] = sw
        for node in sw.nodes:
            if node in leaf_of:
                problems.append(
                    f"line {number}: node {node} is under {leaf_of[node]} already, "
                    f"not under {sw.name}"
                )
                continue
            leaf_of[node] = sw.name
    return Topology(switches, leaf_of, tuple(problems))


def load_topology(source: str, commands: SlurmCommands | None = None) -> Topology:
    """The layout ``network.topology`` names: ``""`` none (an empty :class:`Topology`),
    ``"scontrol"`` from :func:`read_topology` (``commands``, default the ``$PATH`` ones), else the
    file at that path (a ``topology.conf`` or saved ``scontrol show topology`` output, at most
    :data:`MAX_FILE_BYTES`). Raises ConfigError naming ``network.topology`` for a file that
    cannot be read, SlurmCommandError when ``scontrol`` fails."""
    if not source:
        return Topology()
    if source == "scontrol":
        return read_topology(commands or SlurmCommands())
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError("network.topology", f"cannot read {source!r}: {exc.strerror}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError("network.topology", f"{source!r} is larger than {MAX_FILE_BYTES} bytes")
    return parse_topology(raw.decode("utf-8", errors="replace"))


def live_topology(source: str, commands: SlurmCommands | None = None) -> Topology:
    """:func:`load_topology` for a worker: a ``scontrol`` that fails is logged and the worker
    goes on without a layout (no switch finding); the problems of skipped lines are logged.
    Raises ConfigError for a file that cannot be read."""
    try:
        topology = load_topology(source, commands)
    except SlurmCommandError as exc:
        log.warning("network.topology: no switch layout (%s); no switch findings", exc)
        return Topology()
    for problem in topology.problems[:10]:
        log.warning("network.topology: %s", problem)
    return topology


def read_topology(commands: SlurmCommands) -> Topology:
    """The layout from ``scontrol show topology`` (an argument vector, no shell). Without a
    topology plugin Slurm prints nothing on stdout: an empty :class:`Topology`. Raises
    SlurmCommandError when the command cannot run or fails."""
    return parse_topology(commands.run("scontrol", "show", "topology"))
