"""Import paths to objects: "module:attr" (or "module.attr"), the one resolver of the driver's
backends, the pipeline's stages and the RTL transport's job functions."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def resolve(ref: str | Callable, where: str = "", error: type[Exception] = ImportError) -> Callable:
    """`module:attr` (or `module.attr`) -> the object; a callable is returned as is. A bad path
    raises `error` with a message naming it (prefixed by `where`)."""
    if callable(ref):
        return ref
    if not isinstance(ref, str) or not ref:
        raise error(f"{where}expected an import path 'module:name', got {ref!r}")
    mod, sep, attr = ref.partition(":")
    if not sep:
        mod, _, attr = ref.rpartition(".")
    if not mod or not attr:
        raise error(f"{where}{ref!r} is not an import path 'module:name'")
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as e:
        raise error(f"{where}cannot import module {mod!r} of {ref!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise error(f"{where}module {mod!r} has no {attr!r} (from {ref!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise error(f"{where}{ref!r} is not callable")
    return obj
