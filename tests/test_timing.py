"""The epoch timer's clock is read after the loss is converted: the conversion waits for the device."""

from __future__ import annotations

import time
import types

from suite.worker.timing import epoch_timer


class _SlowLoss:
    """A loss whose conversion to a number takes 0.2 s, as a device still computing would."""

    def __float__(self) -> float:
        time.sleep(0.2)
        return 0.5


def test_epoch_time_includes_the_wait_for_the_loss() -> None:
    class Callback:  # the two attributes Keras' base class gives a callback
        params: dict = {"epochs": 1}
        model = None

    fake_keras = types.SimpleNamespace(callbacks=types.SimpleNamespace(Callback=Callback))
    timer = epoch_timer(fake_keras)
    timer.on_train_begin()
    timer.on_epoch_begin(0)
    timer.on_epoch_end(0, {"loss": _SlowLoss()})
    assert timer.losses == [0.5]
    assert timer.epoch_s[0] >= 0.2
