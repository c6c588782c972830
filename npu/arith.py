"""Integer helpers used on every side (sizes, alignment, tiling)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative `a` and positive `b`."""
    return -(-a // b)


def round_up(x: int, a: int) -> int:
    """The smallest multiple of `a` that is >= x."""
    return -(-x // a) * a
