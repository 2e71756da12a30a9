"""Device strings ('cpu', 'gpu:4'): the one parser the worker and the host share.

Standard library only, so the host can import it without the worker's training module and its
framework imports.
"""

from __future__ import annotations


def parse_device(device: str) -> tuple[str, int]:
    """'cpu' -> ('cpu', 1); 'gpu:4' -> ('gpu', 4); the scenario loader has validated the form."""
    kind, _, count = device.partition(":")
    return kind, int(count) if count else 1
