"""Terminal output on ``rich``: consoles, tables that fit the terminal, progress bars.

Every command that prints for a person goes through here, so three rules hold everywhere:

* outside text enters a table or a line only as :func:`user_text` (escaped by
  :func:`peerwatch.display.display_text`, and a :class:`rich.text.Text`, so ``[bold]`` in a
  job name is shown as written, never read as rich markup);
* colour follows ``--color``/``NO_COLOR`` and the stream being a terminal;
* progress bars (with ETA) appear only on a terminal: a pipe, a file or a Slurm hook's log
  gets none.
"""

from __future__ import annotations

import io
import os
import sys
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from peerwatch.display import FIELD_MAX_CHARS, display_text


def user_text(value: Any, max_chars: int = FIELD_MAX_CHARS, style: str = "") -> Text:
    """Outside text as a rich Text: escaped, capped, never parsed as markup."""
    return Text(display_text(value, max_chars), style=style)


def wants_colour(choice: str = "auto", stream: IO[str] | None = None) -> bool:
    """``--color`` ``always``/``never``, or ``auto``: on a terminal unless NO_COLOR is set."""
    if choice != "auto":
        return choice == "always"
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def make_console(
    file: IO[str] | None = None, *, colour: bool | None = None, width: int | None = None
) -> Console:
    """A console on ``file`` (default stdout). ``colour`` None: rich decides (a terminal and no
    NO_COLOR); ``width`` None: the terminal's width, else ``$COLUMNS``, else 80. Highlighting of
    numbers and emoji codes is off: what is printed is what the text holds."""
    return Console(
        file=file,
        width=width,
        force_terminal=colour if colour else None,
        no_color=colour is False,
        color_system="standard" if colour else ("auto" if colour is None else None),
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
    )


def render(renderables: list[Any], *, width: int = 100, colour: bool = False) -> str:
    """``renderables`` printed to a string of ``width`` columns (ANSI codes only with
    ``colour``)."""
    buf = io.StringIO()
    console = make_console(buf, colour=colour, width=width)
    for r in renderables:
        console.print(r)
    return buf.getvalue()


def table(
    *headings: str,
    right: tuple[int, ...] = (),
    keep: tuple[int, ...] = (0,),
    title: str | None = None,
) -> Table:
    """A plain table: a bold header, no box lines (copy-paste friendly), the columns ``right``
    (indexes) right-aligned for numbers. Columns shrink and wrap to the console's width, the
    columns ``keep`` (default the first: a name) last, and never within a word."""
    t = Table(title=title, title_justify="left", box=None, header_style="bold",
              pad_edge=False, show_edge=False)  # fmt: skip
    for i, h in enumerate(headings):
        t.add_column(h, justify="right" if i in right else "left", overflow="fold",
                     no_wrap=i in keep)  # fmt: skip
    return t


def progress_for(stream: IO[str] | None = None, *, enabled: bool = True) -> Progress:
    """A rich progress display on ``stream`` (default stderr) with a bar, the share done,
    elapsed time and ETA; disabled (prints nothing) unless ``enabled`` and ``stream`` is a
    terminal."""
    stream = sys.stderr if stream is None else stream
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
        console=make_console(stream),
        disable=not (enabled and tty),
        transient=False,
    )


class CountProgress:
    """Progress over a known count of items (scenarios, hours): ``advance`` after each; a
    context manager. Nothing is drawn when the stream is not a terminal."""

    def __init__(self, description: str, total: int, stream: IO[str] | None = None,
                 enabled: bool = True) -> None:  # fmt: skip
        self.progress = progress_for(stream, enabled=enabled)
        self.task = self.progress.add_task(description, total=max(0, total), note="")

    def advance(self, note: str = "", steps: int = 1) -> None:
        self.progress.update(self.task, advance=steps, note=display_text(note, 40))

    def __enter__(self) -> CountProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


class EventTimeProgress:
    """A replay's progress in event time (``from_ms`` to ``to_ms``), with the records read and
    their rate: the interface :class:`peerwatch.streams.offline.replay.Progress` names
    (``update(ts_ms, records)``, ``done(records)``). Drawn only on a terminal."""

    def __init__(self, from_ms: int, to_ms: int, stream: IO[str] | None = None,
                 description: str = "replay", enabled: bool = True) -> None:  # fmt: skip
        self.from_ms = from_ms
        self.total_ms = max(1, to_ms - from_ms)
        self.progress = progress_for(stream, enabled=enabled)
        self.task = self.progress.add_task(description, total=self.total_ms, note="")
        # MofN shows event-time ms: replace it by the records count in the note column.
        self.progress.columns = tuple(
            c for c in self.progress.columns if not isinstance(c, MofNCompleteColumn)
        )
        self._started = False

    def update(self, ts_ms: int, records: int, force: bool = False) -> None:
        """Event time ``ts_ms`` reached after ``records`` records (rich limits the redraws)."""
        if not self._started:
            self.progress.start()
            self._started = True
        done_ms = min(self.total_ms, max(0, ts_ms - self.from_ms))
        self.progress.update(self.task, completed=done_ms, note=f"{records:,} records")
        if force:
            self.progress.refresh()

    def done(self, records: int) -> None:
        self.update(self.from_ms + self.total_ms, records, force=True)
        self.progress.stop()
