"""What the terminal shows while a plan runs: the run in flight, its epoch, elapsed time, the plan's ETA.

On a terminal one status line is rewritten in place; elsewhere (CI logs, pipes) only the plain
line each finished run prints, so logs stay one line per run. The ETA is arithmetic on the runs
already done here: a run of a point that ran before is expected to take that point's mean, any
other run the mean of every run so far. Runs skipped or already on file cost nothing.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

CLEAR_LINE = "\r\x1b[K"


def eta_s(durations: dict[str, list[float]], remaining: list[str]) -> float | None:
    """Seconds left for the runs whose point keys are ``remaining``, from ``durations`` (key -> seconds
    of its finished runs); None before any run finished."""
    every = [d for ds in durations.values() for d in ds]
    if not every:
        return None
    overall = sum(every) / len(every)
    return sum(sum(durations[k]) / len(durations[k]) if durations.get(k) else overall for k in remaining)


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


class Progress:
    """Told when a run starts, what its worker reports (``on_event``), and when it ends.

    ``stream``: the terminal to keep a status line on, or None for plain lines only. ``on_event``
    may be called from a backend's log thread, hence the lock.
    """

    def __init__(
        self,
        say: Callable[[str], None] = print,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.say, self.stream, self.clock = say, stream, clock
        self.durations: dict[str, list[float]] = {}
        self.remaining: list[str] = []  # point keys of the runs not yet finished that will run
        self._lock = threading.Lock()
        self._head = ""
        self._phase = ""
        self._started: float | None = None

    def plan(self, to_run: list[str]) -> None:
        """The point keys (fingerprints) of every run the backend will be asked for, in plan order."""
        self.remaining = list(to_run)

    def start(self, head: str) -> None:
        with self._lock:
            self._head, self._phase, self._started = head, "starting", self.clock()
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
            self._started = None
            return seconds

    def eta(self) -> float | None:
        return eta_s(self.durations, self.remaining)

    def line(self, text: str) -> None:
        """A permanent line (one per run); the status line is cleared first and redrawn after."""
        with self._lock:
            if self.stream is not None:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()
            self.say(text)
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
        return f"{self._head}: {self._phase}, {duration_text(elapsed)}; plan ETA {duration_text(self.eta())}"

    def _draw(self) -> None:
        if self.stream is None:
            return
        text = self.status()
        if text:
            # A line longer than the terminal wraps, and "\r" then rewrites only its last row.
            width = shutil.get_terminal_size(fallback=(120, 24)).columns - 1
            self.stream.write(CLEAR_LINE + (text if len(text) <= width else text[: width - 3] + "..."))
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
