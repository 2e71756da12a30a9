"""Calls that must not hold their caller for good: each runs in a daemon thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class InThread:
    """``call()`` started in a daemon thread of its own; ``ended`` is set when it returns or raises.

    An Event, not Thread.join: an interrupt inside join marks the thread as ended on Python 3.11
    (its lock-wait handling), and a second join would then not wait for the cleanup at all.
    """

    def __init__(self, call: Callable[[], Any], name: str):
        self.box: dict[str, Any] = {}
        self.ended = threading.Event()

        def run() -> None:
            try:
                self.box["value"] = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                self.box["error"] = exc
            finally:
                self.ended.set()

        threading.Thread(target=run, name=name, daemon=True).start()

    def outcome(self) -> Any:
        """The call's value, or its exception raised here (once ``ended`` is set)."""
        if "error" in self.box:
            raise self.box["error"]
        return self.box["value"]


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s value, or None when it has not returned within ``seconds`` (it is then left to
    finish, or not, in a daemon thread); its exception is raised here."""
    running = InThread(call, "suite-ray-call")
    if not running.ended.wait(seconds):
        return None
    return running.outcome()
