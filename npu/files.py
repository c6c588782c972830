"""Files written whole or not at all (a temporary file beside the target, renamed over it), so an
interrupted write (Ctrl-C, a full disk, a file-size limit) or several writers at once never leave
half a file in place of the user's old one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix, for writers that go by it: np.save, savefig);
    renamed over `path` when the block ends without an error, removed otherwise."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{p.stem}.", suffix=f".tmp{p.suffix}", dir=p.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: bytes | str) -> None:
    with replacing(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
