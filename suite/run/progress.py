"""What the terminal shows while a plan runs: the run in flight, its epoch, elapsed time, the plan's ETA.

On a terminal one status line is rewritten in place; elsewhere (CI logs, pipes) only the plain
line each finished run prints, so logs stay one line per run. Lines fit ``WIDTH`` columns: the
details are in the result file (``suite show``), and ``-v`` prints them as before.

The ETA follows the rule ``suite check`` states: a run of a point with known runs (earlier results
of the same fingerprint on file, or runs done here) is expected to take that point's median; any
other run the median of every run known; before any run is known, its ``timeout_s``, an upper
bound ("at most"). Runs skipped or already on file cost nothing.
"""

from __future__ import annotations

import shutil
import statistics
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from suite.safe.console import WIDTH
from suite.safe.markdown import escaped_lines

CLEAR_LINE = "\r\x1b[K"

# How much the console says: -q only errors and the closing summary, -v every run with its result file.
QUIET, NORMAL, VERBOSE = -1, 0, 1


def eta_s(
    durations: dict[str, list[float]], remaining: list[str], bounds: dict[str, float] | None = None
) -> float | None:
    """Seconds left for the runs whose point keys are ``remaining``, from ``durations`` (key -> seconds
    of its known runs); before any run is known, the sum of their ``bounds`` (key -> timeout_s), or
    None where a run has none."""
    every = [d for ds in durations.values() for d in ds]
    if not every:
        if bounds is None or any(k not in bounds for k in remaining):
            return None
        return sum(bounds[k] for k in remaining)
    overall = statistics.median(every)
    return sum(statistics.median(durations[k]) if durations.get(k) else overall for k in remaining)


def runs_text(n: int) -> str:
    """ "1 run", "3 runs"."""
    return f"{n} run" if n == 1 else f"{n} runs"


def duration_text(seconds: float | None) -> str:
    """'?' before there is an estimate, else '45 s', '12 min 5 s', '3 h 20 min'."""
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with '...'."""
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


# A point label is not cut shorter than this to make a line fit. Labels of one scenario share their
# start (``variant=steps_per_execution=10, ...`` and ``=100, ...``): cut shorter, they read alike.
LABEL_FLOOR = 48


# What stands before a point label (the run's number and its scenario's name, which the closing
# lines give whole) is not cut shorter than this.
BEFORE_FLOOR = 32


def one_line_label(label: str) -> str:
    """A point label on one line: a line break or a tab (a variant's name may hold one) as a space,
    as the scenario's check of its names folds them (other spaces stay: "a  b" is not "a b")."""
    return label.replace("\n", " ").replace("\t", " ")


def fits(before: str, label: str, after: str, width: int = WIDTH) -> bool:
    """Whether ``before[label]after`` fits ``width`` columns with the label cut to LABEL_FLOOR at most
    and what stands before it to BEFORE_FLOOR."""
    return min(len(before), BEFORE_FLOOR) + min(len(one_line_label(label)), LABEL_FLOOR) + 2 + len(after) <= width


def fit_line(before: str, label: str, after: str, width: int = WIDTH) -> str:
    """``before[label]after`` in ``width`` columns: the point label gives way first (to LABEL_FLOOR
    characters, cut in its middle, where labels of one scenario differ least), then what stands
    before it (a long scenario name, to BEFORE_FLOOR, in its middle), then the line's end (where a
    failure's message stands): the outcome after the label is the last to go. A line break or tab
    in the label (a variant's name may hold one) is a space: the line stays one line."""
    label = one_line_label(label)
    over = len(before) + len(label) + 2 + len(after) - width
    if over > 0:
        label = cut_middle(label, max(LABEL_FLOOR, len(label) - over))
        over = len(before) + len(label) + 2 + len(after) - width
    if over > 0:
        before = cut_middle(before, max(min(len(before), BEFORE_FLOOR), len(before) - over))
    return shorten(f"{before}[{label}]{after}", width)


def cut_middle(text: str, width: int) -> str:
    """``text`` in ``width`` characters, its start and end kept and '...' between them."""
    if len(text) <= width:
        return text
    head = (width - 3 + 1) // 2
    return text[:head] + "..." + text[len(text) - (width - 3 - head) :]


def wrapped(text: str, first: str, indent: str, lines: int = 3, width: int = WIDTH) -> list[str]:
    """``text`` after ``first`` in at most ``lines`` lines of ``width`` columns, the rest cut with '...'."""
    return textwrap.wrap(
        text, width=width, initial_indent=first, subsequent_indent=indent, max_lines=lines, placeholder=" ..."
    )


class Progress:
    """Told when a run starts, what its worker reports (``on_event``), and when it ends.

    ``stream``: the terminal to keep a status line on, or None for plain lines only. ``on_event``
    may be called from a backend's log thread, hence the lock. ``earlier``: point key -> seconds of
    its runs on file, so the ETA is known from the start. ``level``: QUIET, NORMAL or VERBOSE; a
    line is printed when its own level is at most this.
    """

    def __init__(
        self,
        say: Callable[[str], None] = print,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        level: int = NORMAL,
    ):
        self.say, self.stream, self.clock, self.level = say, stream, clock, level
        self.durations: dict[str, list[float]] = {}  # point key -> seconds its runs took (plan's earlier, then these)
        self.remaining: list[str] = []  # point keys of the runs not yet finished that will run
        self.bounds: dict[str, float] = {}  # point key -> its timeout_s
        self._lock = threading.Lock()
        self._head = ""
        self._phase = ""
        self._key: str | None = None
        self._started: float | None = None

    def plan(
        self, to_run: list[str], bounds: dict[str, float] | None = None, earlier: dict[str, list[float]] | None = None
    ) -> None:
        """The point keys (fingerprints) of every run the backend will be asked for, in plan order,
        and each key's timeout_s: the ETA before any run of the plan is known; ``earlier``: the
        seconds runs of these keys took before (the results on file)."""
        self.remaining = list(to_run)
        self.bounds = dict(bounds or {})
        for key, seconds in (earlier or {}).items():
            if seconds:
                self.durations.setdefault(key, []).extend(seconds)

    def start(self, head: str, key: str | None = None) -> None:
        with self._lock:
            self._head, self._phase, self._key, self._started = head, "starting", key, self.clock()
            self._draw()

    def on_event(self, event: dict[str, Any]) -> None:
        """A worker's progress event: {"event": "epoch", "epoch": 2, "epochs": 10}, {"event": "phase", "phase": ...}."""
        kind = event.get("event")
        if kind == "epoch" and event.get("epoch") is not None:
            phase = f"epoch {event['epoch']}" + (f" of {event['epochs']}" if event.get("epochs") else "")
        elif isinstance(kind, str):
            # {"event": "phase", "phase": "evaluate"} reads as "evaluate"
            detail = event.get(kind)
            phase = detail if isinstance(detail, str) and detail else kind
        else:
            return
        with self._lock:
            self._phase = phase
            self._draw()

    def finish(self, key: str | None) -> float:
        """The run in flight ended; ``key`` its point key when it ran (None: skipped). Returns its seconds."""
        with self._lock:
            seconds = self.clock() - self._started if self._started is not None else 0.0
            if key is not None:
                self.durations.setdefault(key, []).append(seconds)
                if key in self.remaining:
                    self.remaining.remove(key)
            self._started, self._key = None, None
            return seconds

    def eta(self) -> float | None:
        return eta_s(self.durations, self.remaining, self.bounds)

    def eta_text(self, elapsed: float = 0.0) -> str:
        """'ETA 2 min 5 s'; 'ETA at most 2 h 0 min' while no run is known (the runs' timeout_s).

        ``elapsed``: seconds the run in flight has gone, taken off its own share, so the ETA counts
        down while it runs (never below the other runs' share when it takes longer than expected).
        """
        seconds = self.eta()
        if seconds is None:
            return "ETA ?"
        if self._key is not None:
            seconds -= min(elapsed, eta_s(self.durations, [self._key], self.bounds) or 0.0)
        known = any(self.durations.values())
        return f"ETA {duration_text(seconds)}" if known else f"ETA at most {duration_text(seconds)}"

    def eta_basis(self) -> str:
        """Where the ETA comes from, said once when the plan starts."""
        if not self.remaining:
            return ""
        measured = sum(1 for k in self.remaining if self.durations.get(k))
        if measured == len(self.remaining):
            return "from earlier runs of the same points"
        if measured:
            return f"{measured} of {len(self.remaining)} from earlier runs of the same points, the others at the median"
        if any(self.durations.values()):
            return "the median of earlier runs of other points"
        return "the runs' timeout_s: no earlier result to go by"

    def line(self, text: str, level: int = NORMAL) -> None:
        """A permanent line, printed when ``level`` is at most the console's; the status line is
        cleared first and redrawn after. Control characters are escaped (newlines kept): a line may
        quote a worker's message or a Ray node's label, which a terminal must show, not obey."""
        if level > self.level:
            return
        with self._lock:
            if self.stream is not None:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()
            self.say(escaped_lines(text))
            self._draw()

    def tick(self) -> None:
        """Redraw, so elapsed time moves between events."""
        with self._lock:
            self._draw()

    def close(self) -> None:
        with self._lock:
            if self.stream is not None:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()

    def status(self) -> str:
        if self._started is None:
            return ""
        elapsed = self.clock() - self._started
        return f"{self._head}: {self._phase}, {duration_text(elapsed)}; {self.eta_text(elapsed)}"

    def _draw(self) -> None:
        if self.stream is None:
            return
        text = self.status()
        if text:
            # A line longer than the terminal wraps, and "\r" then rewrites only its last row.
            width = shutil.get_terminal_size(fallback=(WIDTH, 24)).columns - 1
            self.stream.write(CLEAR_LINE + shorten(text, width))
            self.stream.flush()


class Ticker:
    """Redraws the status line once a second while a run is in flight (terminal only)."""

    def __init__(self, progress: Progress, every_s: float = 1.0):
        self.progress, self.every_s = progress, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="suite-progress", daemon=True)

    def __enter__(self) -> Ticker:
        if self.progress.stream is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.progress.tick()
