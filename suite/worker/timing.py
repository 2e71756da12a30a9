"""The epoch timer: epoch wall times and the first step, without a device sync on every step.

It also prints one progress line per epoch (``@@suite {json}``) that the host streams for live
progress; the host never takes results from stdout, only from the result file.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

EVENT_PREFIX = "@@suite "  # the host's backends.worker_output.EVENT_PREFIX: the worker imports nothing of the host
_timers_made = 0  # the first timer of a process times the run's fit; later ones time probes


def emit(event: dict[str, Any]) -> None:
    """One progress line on stdout; never fails the run (a closed pipe only loses progress)."""
    try:
        print(EVENT_PREFIX + json.dumps(event, sort_keys=True), flush=True)
    except (OSError, ValueError):
        pass


def epoch_timer(keras: Any) -> Any:
    """A fresh timer callback (the class is made per call: keras is imported after backend setup)."""
    global _timers_made
    _timers_made += 1
    phase = "fit" if _timers_made == 1 else "probe"

    class EpochTimer(keras.callbacks.Callback):
        """Epoch wall times and the first step, without forcing a sync on every step.

        Only batch *begin* is hooked: overriding a batch *end* hook makes Keras convert the logs
        to Python numbers after every step, a device sync that a plain script does not pay.
        The first step is the time from fit's start to the second step's begin (tracing and
        compilation are host-side and synchronous, so they are inside it).
        """

        def __init__(self) -> None:
            super().__init__()
            self.epoch_s: list[float] = []
            self.losses: list[float] = []
            self.first_step_s: float | None = None
            self.nan = False
            self._t_fit = self._t_epoch = 0.0
            self._begins = 0

        def on_train_begin(self, logs: Any = None) -> None:
            emit({"event": "phase", "phase": phase})
            self._t_fit = time.perf_counter()

        def on_train_end(self, logs: Any = None) -> None:
            if phase == "fit":
                emit({"event": "phase", "phase": "evaluate"})

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._t_epoch = time.perf_counter()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._begins += 1
            if self._begins == 2 and self.first_step_s is None:
                self.first_step_s = time.perf_counter() - self._t_fit

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            # The loss first: converting it waits for the device, so the clock read after it
            # holds all of the epoch's work however the logs arrive.
            loss = float((logs or {}).get("loss", float("nan")))
            self.epoch_s.append(time.perf_counter() - self._t_epoch)
            self.losses.append(loss)
            if self.first_step_s is None:
                self.first_step_s = self.epoch_s[0]  # a single step in the whole epoch
            if not math.isfinite(loss):
                self.nan = True
                self.model.stop_training = True
            # After the clock is read: printing is not part of the epoch's time.
            epochs = (self.params or {}).get("epochs")
            emit(
                {
                    "event": "epoch",
                    "phase": phase,
                    "epoch": epoch + 1,
                    "epochs": epochs,
                    "epoch_s": round(self.epoch_s[-1], 6),
                    "loss": loss if math.isfinite(loss) else None,
                }
            )

    return EpochTimer()
