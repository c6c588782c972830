"""Files written whole or not at all (a temporary file beside the target, renamed over it), so an
interrupted write (Ctrl-C, a full disk, a file-size limit) or several writers at once never leave
half a file in place of the user's old one."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
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


def tree_digest(paths: Iterable[str | Path], suffixes: tuple[str, ...] = (".py",)) -> str:
    """SHA-256 of the files under `paths` (folders recursively) with these suffixes: names and
    contents, in a stable order. What a cached result's sources are keyed by."""
    h = hashlib.sha256()
    for root in map(Path, paths):
        files = sorted(root.rglob("*")) if root.is_dir() else [root]
        for f in files:
            if f.suffix in suffixes and "__pycache__" not in f.parts and f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


class JsonCache:
    """Results on disk, one JSON file per key (written atomically; an unreadable file is a miss)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)

    def get(self, key: str) -> dict | None:
        try:
            return json.loads((self.dir / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, result: dict) -> None:
        write_atomic(self.dir / f"{key}.json", json.dumps(result))
