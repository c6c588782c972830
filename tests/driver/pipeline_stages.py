"""Importable stage functions for the pipeline tests (process workers need module-level functions)."""

from __future__ import annotations

import os
import random
import time


def numbers(n: int = 10):
    yield from range(n)


def endless():
    i = 0
    while True:
        yield i
        i += 1


def square(x):
    return x * x


def negate(x):
    return -x


def jitter(x, scale: float = 0.01):
    time.sleep(random.random() * scale)
    return x


def slow(x, s: float = 0.05):
    time.sleep(s)
    return x


def pid(x):
    return (x, os.getpid())


def fail_on(x, bad: int = 3):
    if x == bad:
        raise ValueError(f"cannot take {x}")
    return x


def failing_source(n: int = 5, bad: int = 2):
    for i in range(n):
        if i == bad:
            raise OSError("camera unplugged")
        yield i


def busy(x, n: int = 200_000):
    """CPU-bound pure Python (holds the GIL): process workers run it in parallel."""
    s = 0
    for i in range(n):
        s += i * i % 7
    return x
