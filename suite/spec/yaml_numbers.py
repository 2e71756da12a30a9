"""How YAML 1.1 reads numbers, which the scenario files are read by (PyYAML): advice for a number
written as JSON and YAML 1.2 write it that the files' reader took as text."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

# A number with an exponent as JSON and YAML 1.2 write it, which YAML 1.1 (PyYAML, the files'
# reader) reads as text unless it has a dot and a signed exponent: 1e-3 and 1.0e3 are strings there.
_NUMBER_WRITTEN_AS_TEXT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")


def text_number_advice(value: Any, accepts: Callable[[Any], bool]) -> str:
    """Where ``value`` is such text and the number it spells is one ``accepts`` takes: the number as
    YAML 1.1 reads it ("; YAML reads 1e-3 as text ...: write 0.001"); '' otherwise (a setting of
    text, or a number it would refuse too)."""
    if not (isinstance(value, str) and _NUMBER_WRITTEN_AS_TEXT.fullmatch(value)):
        return ""
    number = float(value)
    if not math.isfinite(number):
        return ""
    if number.is_integer() and accepts(int(number)):
        written = str(int(number))
    elif accepts(number):
        written = _yaml11_float(number)
    else:
        return ""
    return f"; YAML reads {value} as text (an exponent needs a dot and a sign): write {written}"


def _yaml11_float(number: float) -> str:
    """``number`` as YAML 1.1 reads a float back: 0.001, 1.0e-05 (never Python's 1e-05, text there)."""
    text = repr(number)
    if "e" in text:
        mantissa, exponent = text.split("e")
        mantissa += "" if "." in mantissa else ".0"
        text = f"{mantissa}e{exponent if exponent[0] in '+-' else '+' + exponent}"
    return text
