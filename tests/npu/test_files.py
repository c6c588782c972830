"""Files the project writes over a user's file are replaced whole or not at all: a write stopped by
a file-size limit or by Ctrl-C leaves the old file intact and no temporary file behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from npu.files import replacing, write_atomic

OLD = b"the user's only copy\n" * 10


def test_a_file_size_limit_mid_write_leaves_the_old_file(tmp_path):
    """A real RLIMIT_FSIZE in a child process: the write fails with EFBIG part-way."""
    target = tmp_path / "m.npub"
    target.write_bytes(OLD)
    code = textwrap.dedent(
        f"""
        import errno, resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        from npu.files import write_atomic
        try:
            write_atomic({str(target)!r}, b"x" * (1 << 20))
        except OSError as e:
            raise SystemExit(10 if e.errno == errno.EFBIG else 11)
        raise SystemExit(0)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 10, r.stderr
    assert target.read_bytes() == OLD
    assert [p.name for p in tmp_path.iterdir()] == ["m.npub"]


@pytest.mark.parametrize("kind", ["bytes", "npy", "chrome"])
def test_sigint_mid_write_leaves_the_old_file(tmp_path, monkeypatch, kind):
    """A real SIGINT raised while the temporary file is half written: KeyboardInterrupt reaches the
    caller, the old file is untouched and the temporary file is gone."""
    from npu.driver import Trace

    target = tmp_path / ("y.npy" if kind == "npy" else "out.bin")
    target.write_bytes(OLD)
    real_write = type(target).write_bytes

    def half_then_sigint(self, data):
        real_write(self, data[: len(data) // 2])
        signal.raise_signal(signal.SIGINT)
        real_write(self, data)  # never reached: the interrupt lands first

    # Python's own SIGINT handler (a test worker may have replaced or ignored it)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(type(target), "write_bytes", half_then_sigint)
    monkeypatch.setattr(type(target), "write_text", lambda self, s: half_then_sigint(self, s.encode()))
    try:
        with pytest.raises(KeyboardInterrupt):
            if kind == "bytes":
                write_atomic(target, b"new" * 1000)
            elif kind == "chrome":
                Trace().save_chrome(target)
            else:
                with replacing(target) as tmp:
                    np.save(tmp, np.zeros(10))
                    tmp.write_bytes(tmp.read_bytes())  # the interrupted write
    finally:
        signal.signal(signal.SIGINT, old)
    assert target.read_bytes() == OLD
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
