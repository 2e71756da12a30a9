"""A running worker seen from the host: its output read as it comes (the log's tail, the progress
events) and its time limit."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

LOG_TAIL_LINES = 60
EVENT_PREFIX = "@@suite "  # a worker progress line: the prefix, then one JSON object
EventSink = Callable[[dict[str, Any]], None]


class Deadline:
    """The run's time limit: a timer thread that kills the worker when it runs out.

    ``fired`` is set before the kill is sent: the exit the kill causes can reach the thread in
    ``wait`` before ``kill()`` returns, and must read as a timeout. A kill that finds the worker
    already ended by itself takes the mark back.
    """

    def __init__(self, seconds: float):
        self.seconds, self.fired = seconds, False
        self._timer: threading.Timer | None = None

    def arm(self, kill: Callable[[], bool]) -> None:
        self._timer = threading.Timer(self.seconds, self._kill, args=(kill,))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> bool:
        """Stop the timer, let a kill in flight finish, and say whether the deadline ended the run."""
        if self._timer is not None:
            self._timer.cancel()
            if self._timer is not threading.current_thread():
                self._timer.join()
        return self.fired

    def _kill(self, kill: Callable[[], bool]) -> None:
        self.fired = True
        try:
            if not kill():
                self.fired = False  # it ended on its own before the kill: not a timeout
        except Exception:  # noqa: BLE001 - the limit was reached; that is what is known, and the thread must not die
            pass


class LogPump(threading.Thread):
    """Reads a worker's output as it comes: keeps the tail, hands progress lines to ``on_event``."""

    def __init__(self, lines: Iterator[str], on_event: EventSink | None):
        super().__init__(daemon=True)
        self._lines, self._on_event = lines, on_event
        self._tail: deque[str] = deque(maxlen=LOG_TAIL_LINES * 4)
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            for line in self._lines:
                line = line.rstrip("\r\n")
                with self._lock:
                    self._tail.append(line)
                event = parse_event(line)
                if event is not None and self._on_event is not None:
                    try:
                        self._on_event(event)
                    except Exception:  # noqa: BLE001 - a display problem must never fail a run
                        pass
        except Exception as exc:  # noqa: BLE001 - a broken stream ends the log, not the run
            with self._lock:
                self._tail.append(f"[log stream ended: {type(exc).__name__}: {exc}]")

    def text(self) -> str:
        with self._lock:
            return "\n".join(self._tail)


def parse_event(line: str) -> dict[str, Any] | None:
    """The dict of a worker progress line (``@@suite {...}``), or None for any other line."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        event = json.loads(line[len(EVENT_PREFIX) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def split_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Text lines from a stream of byte chunks that may cut a line (or a UTF-8 character) anywhere."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *whole, buffer = buffer.split(b"\n")
        for line in whole:
            yield line.decode("utf-8", errors="replace")
    if buffer:
        yield buffer.decode("utf-8", errors="replace")


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
