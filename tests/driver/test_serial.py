"""The serial backend (protocol v2): the client against the reference bridge (golden model behind it)
over a socket pair, directly and through a proxy that injects faults into every frame."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu.config import get_config
from npu.driver import ModelTransport, Npu, Priority, TransportError
from npu.driver.bench import preempt_at_every_point
from npu.driver.serial import (
    SerialTransport,
    SocketStream,
    serve,
)
from npu.registers import REG
from npu.serial_protocol import (
    HELLO,
    READ_REG,
    FrameReader,
    cobs_decode,
    cobs_encode,
    decode_frame,
    encode_frame,
)


def _bridge(cfg, sock) -> threading.Thread:
    dev = ModelTransport(cfg)
    t = threading.Thread(target=serve, args=(SocketStream(sock), dev, cfg.dram_bytes), daemon=True)
    t.start()
    return t


@pytest.fixture
def link():
    cfg = get_config("tiny")
    a, b = socket.socketpair()
    _bridge(cfg, b)
    yield cfg, a
    a.close()
    b.close()


def test_driver_over_the_serial_protocol(link, small_models):
    cfg, sock = link
    c_low, c_hi, x, xu = small_models
    npu = Npu(transport=SerialTransport(cfg, stream=SocketStream(sock)), config="tiny")
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
    t = SerialTransport(cfg, stream=SocketStream(sock))
    with pytest.raises(TransportError, match="address outside DRAM"):
        t.read_dram(cfg.dram_bytes - 2, 16)
    assert t.read_reg(REG["ID"].offset)  # the link goes on
    with pytest.raises(TransportError, match="port="):
        SerialTransport(cfg)
    quiet, _other = socket.socketpair()  # nobody answers: a bounded wait, then a clear error
    with pytest.raises(TransportError, match="no NPU bridge answers protocol v2"):
        SerialTransport(cfg, stream=SocketStream(quiet), timeout_s=0.02, retries=2)


@given(st.binary(max_size=700))
def test_cobs_round_trip_has_no_zero_bytes(data):
    enc = cobs_encode(data)
    assert 0 not in enc and cobs_decode(enc) == data


def test_cobs_known_vectors():
    assert cobs_encode(b"\x00") == b"\x01\x01"
    assert cobs_encode(b"\x11\x22\x00\x33") == b"\x03\x11\x22\x02\x33"
    assert cobs_encode(bytes(range(1, 256))) == b"\xff" + bytes(range(1, 255)) + b"\x02\xff"
    with pytest.raises(ValueError):
        cobs_decode(b"\x05\x11")


def test_crc_catches_what_the_old_checksum_passed():
    """Defect: an additive checksum passed +1/-1 pairs and swapped bytes (a READ_DRAM reply came back
    [-59, -36, ...] for [-60, -35, ...]). Every such change to a reply is refused now."""
    payload = np.array([-60, -35, 17, 99, -128, 127, 0, 5], np.int8).tobytes()
    body = cobs_decode(encode_frame(7, 0, payload)[:-1])
    for i in range(3, len(body) - 5):
        for j in range(i + 1, len(body) - 4):
            pm = bytearray(body)
            pm[i], pm[j] = (pm[i] + 1) & 0xFF, (pm[j] - 1) & 0xFF
            sw = bytearray(body)
            sw[i], sw[j] = sw[j], sw[i]
            for bad in (pm, sw):
                if bytes(bad) != body:
                    assert decode_frame(cobs_encode(bytes(bad))) is None


class FaultyLink:
    """A proxy between host and bridge that damages frames both ways: bit flips, drops, duplicates,
    delays beyond the host's timeout, truncation, garbage between frames."""

    KINDS = ("flip", "drop", "duplicate", "delay", "truncate", "garbage")

    def __init__(self, host_sock, dev_sock, rate: float, delay_s: float, seed: int):
        self.rate, self.delay_s = rate, delay_s
        self.rng = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.timers: list[threading.Timer] = []
        for src, dst in ((host_sock, dev_sock), (dev_sock, host_sock)):
            threading.Thread(target=self._pump, args=(src, dst, threading.Lock()), daemon=True).start()

    def _pump(self, src, dst, send_lock) -> None:
        reader = FrameReader(limit=1 << 20)

        def send(data: bytes) -> None:
            with send_lock:
                try:
                    dst.sendall(data)
                except OSError:
                    pass

        while True:
            try:
                chunk = src.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            for f in reader.feed(chunk):
                frame = f + b"\x00"
                with self.lock:
                    kind = self.rng.choice(self.KINDS) if self.rng.random() < self.rate else None
                    if kind:
                        self.faults[kind] += 1
                    r = self.rng.random()
                    garbage = bytes(self.rng.randrange(256) for _ in range(1 + int(r * 12)))
                if kind == "flip":
                    b = bytearray(frame)
                    k = int(r * len(b))
                    b[k] ^= 1 << int(r * 97) % 8
                    send(bytes(b))
                elif kind == "drop":
                    pass
                elif kind == "duplicate":
                    send(frame + frame)
                elif kind == "delay":
                    t = threading.Timer(self.delay_s, send, args=(frame,))
                    t.daemon = True
                    t.start()
                elif kind == "truncate":
                    send(frame[: int(r * (len(frame) - 1))] + b"\x00")
                elif kind == "garbage":
                    send(garbage + frame)
                else:
                    send(frame)


def test_faults_on_the_link_are_absorbed_or_reported(small_models):
    """At least 10,000 injected faults: every request either returns the right answer (after
    retries) or raises TransportError, the link works afterwards, nothing hangs."""
    cfg = get_config("tiny")
    host, proxy_host = socket.socketpair()
    proxy_dev, dev = socket.socketpair()
    _bridge(cfg, dev)
    timeout_s = 0.005
    link = FaultyLink(proxy_host, proxy_dev, rate=0.3, delay_s=3 * timeout_s, seed=1)
    tr = SerialTransport(cfg, stream=SocketStream(host), timeout_s=timeout_s, retries=6)
    rng = np.random.default_rng(0)
    window = 1 << 16
    shadow = np.zeros(window, np.uint8)
    tr.write_dram(0, shadow.tobytes())
    figures = Counter()

    def workload():
        while sum(link.faults.values()) < 10_000:
            op = int(rng.integers(4))
            try:
                if op == 0:
                    a, n = int(rng.integers(window - 6000)), int(rng.integers(1, 6000))
                    data = rng.integers(0, 256, n, dtype=np.uint8)
                    shadow[a : a + n] = data
                    while True:  # a write that was given up is repeated: the link must recover
                        try:
                            tr.write_dram(a, data.tobytes())
                            break
                        except TransportError:
                            figures["raised"] += 1
                elif op == 1:
                    a, n = int(rng.integers(window - 6000)), int(rng.integers(1, 6000))
                    got = np.frombuffer(tr.read_dram(a, n), np.uint8)
                    figures["wrong"] += int(not np.array_equal(got, shadow[a : a + n]))
                elif op == 2:
                    v = int(rng.integers(0, 1 << 32)) & ~63
                    tr.write_reg(REG["PROGRAM_BASE"].offset, v)
                    figures["wrong"] += int(tr.read_reg(REG["PROGRAM_BASE"].offset) != v)
                else:
                    t = tr.now()
                    figures["wrong"] += int(t < figures["last_now"])
                    figures["last_now"] = t
                figures["ops"] += 1
            except TransportError:
                figures["raised"] += 1
        # and a whole preempted job over the damaged link: right outputs or a job failed clearly
        c_low, c_hi, x, xu = small_models
        ref = Npu("model", "tiny").load(c_low).run(x, int8=True)
        npu = Npu(transport=tr, config="tiny")
        low, hi = npu.load(c_low), npu.load(c_hi)
        jobs = [
            low.submit(x, priority=Priority.LOW, int8=True),
            hi.submit(xu, priority=Priority.HIGH, at=500),
        ]
        npu.run_all()
        for j in jobs[:1]:
            if j.state == "done":
                figures["wrong"] += int(not np.array_equal(j.outputs[0], ref[0]))
            else:
                assert isinstance(j.error, TransportError)
                figures["raised"] += 1

    t0 = time.monotonic()
    worker = threading.Thread(target=workload, daemon=True)
    worker.start()
    worker.join(timeout=600)
    hangs = int(worker.is_alive())
    n = sum(link.faults.values())
    print(
        f"\nserial fault injection: {n} faults {dict(link.faults)}, {figures['ops']} requests, "
        f"{tr.stats.retries} retries ({tr.stats.resend} asked by the bridge), "
        f"{figures['raised']} TransportErrors, {figures['wrong']} wrong "
        f"results, {hangs} hangs, {time.monotonic() - t0:.1f} s"
    )
    assert hangs == 0 and figures["wrong"] == 0 and n >= 10_000
    # afterwards the link works
    assert tr.read_reg(REG["ID"].offset) == Npu("model", "tiny").tr.reg("ID")


def test_a_late_reply_does_not_shift_the_replies_after_it(link):
    """Defect: a reply arriving after the client's timeout shifted every later reply by one."""
    cfg, sock = link
    tr = SerialTransport(cfg, stream=SocketStream(sock), timeout_s=0.2)
    tr.write_dram(0, bytes(range(256)))
    # a stale reply (an old sequence number) lands in the host's queue before the real one
    stale = encode_frame((tr._seq) & 0xFFFF, 0, struct.pack("<I", 0xDEADBEEF))
    tr._frames.put(stale[:-1])
    assert tr.read_dram(0, 256) == bytes(range(256))
    assert tr.stats.stale == 1
    for _ in range(20):
        assert tr.read_reg(REG["PROGRAM_BASE"].offset) == tr.read_reg(REG["PROGRAM_BASE"].offset)


def test_the_bridge_answers_a_repeated_request_from_its_cache():
    cfg = get_config("tiny")
    a, b = socket.socketpair()
    _bridge(cfg, b)
    f = SocketStream(a)
    frames = FrameReader()

    def ask(seq, cmd, payload):
        f.write(encode_frame(seq, cmd, payload))
        while True:
            got = frames.feed(f.read1(4096))
            if got:
                return decode_frame(got[0])

    assert ask(1, HELLO, b"\x02")[1] == 0
    assert ask(1, HELLO, b"\x01")[1] != 0  # a v1 host is refused
    r1 = ask(5, READ_REG, struct.pack("<I", REG["ID"].offset))
    assert ask(5, READ_REG, struct.pack("<I", REG["ID"].offset)) == r1  # repeated
    a.close()


def test_npu_run_on_a_board_through_its_serial_port(tmp_path, capsys):
    """`npu run --backend serial --port URL`: the CLI's board path, against the reference bridge on
    a TCP port (a pyserial URL, as a USB UART's device name would be)."""
    from npu.cli import main
    from npu.driver.demo import compile_zoo

    c, x = compile_zoo("digits_mlp", "tiny", tmp_path)
    c.save(tmp_path / "m.npub")
    np.save(tmp_path / "x.npy", x)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def accept():
        conn, _ = server.accept()
        serve(SocketStream(conn), ModelTransport(get_config("tiny")), get_config("tiny").dram_bytes)
        conn.close()

    threading.Thread(target=accept, daemon=True).start()
    args = ["run", str(tmp_path / "m.npub"), "--input", str(tmp_path / "x.npy")]
    assert main([*args, "--backend", "serial", "--port", f"socket://127.0.0.1:{port}",
                 "--output", str(tmp_path / "y.npy")]) == 0  # fmt: skip
    server.close()
    assert main([*args, "--output", str(tmp_path / "ref.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "y.npy"), np.load(tmp_path / "ref.npy"))
    capsys.readouterr()
    assert main([*args, "--backend", "serial"]) == 2
    assert "--backend serial needs --port" in capsys.readouterr().err
    assert main([*args, "--backend", "serial", "--port", str(tmp_path / "no-such-tty")]) == 2
    assert "no-such-tty" in capsys.readouterr().err
