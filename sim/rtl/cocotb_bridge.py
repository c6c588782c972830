"""cocotb test bench for the RTL serial bridge (`npu.hdl.boards.bridge.SerialBridge`).

The top (`bridge_top_verilog`) is the bridge alone with flat ports: cocotbext-axi's `AxiRam` is the
DRAM on `m_axi_*`, an `AxiLiteRam` stands for the core's registers on `m_axil_*`, and the UART pins
`rx` / `tx` are driven by cocotbext-uart. A small core model turns STATUS from RUNNING to DONE a set
number of STATUS reads after the host wrote RUNNING into it, so WAIT has something to wait for.

`test_host_client` runs the unchanged host client `npu.driver.serial.SerialTransport` in a thread;
its byte stream is a pair of thread-safe queues that a coroutine moves to and from the UART.
Every AXI channel stalls at random in its first half. `test_raw_frames` sends hand-made frames and
checks every reply byte for byte against the reference encoder (`encode_frame`), AXI error
responses included. Parameters come from the environment (NPU_BRIDGE, JSON).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import struct
import threading

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, Timer
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteRam, AxiRam
from cocotbext.uart import UartSink, UartSource

from npu.driver.serial import (
    SerialTransport,
)
from npu.registers import Status
from npu.serial_protocol import (
    BAD_ADDRESS,
    BAD_COMMAND,
    BAD_LENGTH,
    BAD_VERSION,
    DEVICE_ERROR,
    HELLO,
    MAGIC,
    NO_LIMIT,
    NOW,
    OK,
    READ_DRAM,
    READ_REG,
    RESEND,
    VERSION,
    WAIT,
    WRITE_DRAM,
    WRITE_REG,
    cobs_encode,
    decode_frame,
    encode_frame,
)
from npu.sim.rtl.cocotb_bench import random_stalls

PERIOD_NS = 10
STATUS = 0x10
RUN_POLLS = 150  # STATUS reads the core model stays RUNNING for (the bridge polls every 16 cycles)


def params() -> dict:
    return json.loads(os.environ["NPU_BRIDGE"])


def bridge_top_verilog(p: dict) -> str:
    """The Verilog of the test top (module `bridge_top`) for parameters `p`."""
    from amaranth.back import verilog

    from npu.hdl.axi import FlatPorts
    from npu.hdl.boards.bridge import SerialBridge

    bridge = SerialBridge(
        dram_bytes=p["dram_bytes"],
        data_width=p["data_width"],
        divisor=p["divisor"],
        max_packet=p["max_packet"],
    )
    top = FlatPorts(bridge, {"regs": "m_axil", "dram": "m_axi"})
    return verilog.convert(top, name="bridge_top", emit_src=False)


class Bench:
    def __init__(self, dut):
        self.dut, self.p = dut, params()
        baud = 1e9 / (PERIOD_NS * self.p["divisor"])
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=self.p["dram_bytes"])
        self.regs = AxiLiteRam(AxiLiteBus.from_prefix(dut, "m_axil"), dut.clk, dut.rst, size=256)
        self.src = UartSource(dut.rx, baud=baud)
        self.sink = UartSink(dut.tx, baud=baud)
        for uart in (self.src, self.sink):
            uart.log.setLevel(logging.WARNING)  # a line per byte otherwise
        self.buf = bytearray()
        # accesses in [lo, hi) are answered with SLVERR (cocotbext-axi does when a hook raises)
        self.fault = {"dram": (0, 0), "regs": (0, 0)}
        for name, ram in (("dram", self.ram), ("regs", self.regs)):
            for iface, op in ((ram.read_if, "_read"), (ram.write_if, "_write")):
                plain = getattr(type(iface), op).__get__(iface)

                async def hook(address, arg, plain=plain, name=name):
                    lo, hi = self.fault[name]
                    if lo <= address < hi:
                        raise OSError(f"bus fault at 0x{address:x}")
                    return await plain(address, arg)

                setattr(iface, op, hook)

    def stall(self, on: bool = True) -> None:
        """Every AXI channel of both memories pauses at random (or no longer: a paused channel
        costs a coroutine step every cycle)."""
        channels = []
        for ram in (self.ram, self.regs):
            channels += [ram.read_if.ar_channel, ram.read_if.r_channel, ram.write_if.aw_channel]
            channels += [ram.write_if.w_channel, ram.write_if.b_channel]
        for seed, ch in enumerate(channels):
            ch.set_pause_generator(random_stalls(seed, 0.3) if on else None)
            ch.pause = False

    async def reset(self) -> None:
        cocotb.start_soon(Clock(self.dut.clk, PERIOD_NS, unit="ns").start())
        self.dut.irq.value = 0
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        self.t_reset = self.now()
        await ClockCycles(self.dut.clk, 4)

    def now(self) -> int:
        from cocotb.utils import get_sim_time

        return int(get_sim_time(unit="ns")) // PERIOD_NS

    async def core_model(self) -> None:
        """A core the host set RUNNING (by writing STATUS) stops (DONE) at the RUN_POLLS-th STATUS
        read of the bridge: it runs only while a WAIT looks at it, so the host's own pace between
        requests does not count."""
        dut = self.dut
        polls = 0
        while True:
            await RisingEdge(dut.m_axil_arvalid)
            if int(dut.m_axil_araddr.value) == STATUS and self.regs.read_dword(STATUS) == Status.RUNNING:
                polls += 1
                if polls == RUN_POLLS:
                    polls = 0
                    self.regs.write_dword(STATUS, int(Status.DONE))

    # -- raw frames ------------------------------------------------------------------------------
    async def send(self, raw: bytes) -> None:
        await self.src.write(raw)
        await self.src.wait()

    async def reply(self, cycles: int = 60_000) -> bytes | None:
        """The next frame from the bridge (without its delimiter), None if none within `cycles`."""
        t0 = self.now()
        while True:
            self.buf += self.sink.read_nowait()
            if 0 in self.buf:
                i = self.buf.index(0)
                frame = bytes(self.buf[:i])
                del self.buf[: i + 1]
                return frame
            if self.now() - t0 > cycles:
                return None
            await ClockCycles(self.dut.clk, 16)

    async def call(self, seq: int, cmd: int, payload: bytes, status: int, data: bytes = b"") -> None:
        """Send a request and check that the reply is exactly the reference's frame."""
        await self.send(encode_frame(seq, cmd, payload))
        got = await self.reply()
        want = encode_frame(seq, status, data)[:-1]
        assert got == want, f"cmd {cmd} seq {seq}: got {got!r}, want {want!r}"

    async def silent(self, raw: bytes, cycles: int = 3000) -> None:
        """Send `raw`: the bridge must not answer."""
        await self.send(raw)
        got = await self.reply(cycles)
        assert got is None, f"unexpected reply {got!r}"

    async def framing_error(self) -> None:
        """A byte whose stop bit is 0 (the line held low for 12 bit times)."""
        bit = self.p["divisor"] * PERIOD_NS
        self.dut.rx.value = 0
        await Timer(12 * bit, unit="ns")
        self.dut.rx.value = 1
        await Timer(3 * bit, unit="ns")


class QueueStream:
    """The host's byte stream: writes go to `to_dev`, reads come from `from_dev` (thread-safe)."""

    timeout = 0.05

    def __init__(self):
        self.to_dev: queue.Queue[bytes] = queue.Queue()
        self.from_dev: queue.Queue[bytes] = queue.Queue()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.to_dev.put(bytes(data))

    def flush(self) -> None:
        pass

    def read1(self, n: int) -> bytes:
        if self.closed:
            return b""
        try:
            return self.from_dev.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError from None

    read = read1

    def close(self) -> None:
        self.closed = True


def host_job(stream: QueueStream, p: dict, ref: bytearray, out: dict, calm: threading.Event) -> None:
    """The host side, in a thread: the real client against the bridge (every AXI channel stalls
    until `calm` is set, after half the DRAM operations)."""
    from npu.config import get_config

    rng = random.Random(7)
    t = SerialTransport(get_config("tiny"), stream=stream, timeout_s=30.0, retries=1)
    try:
        assert t.dram_bytes == p["dram_bytes"], t.dram_bytes
        assert t.max_chunk == p["max_packet"], t.max_chunk
        # registers
        vals = {off: rng.getrandbits(32) for off in (0x0C, 0x18, 0x2C, 0x40, 0xFC)}
        for off, v in vals.items():
            t.write_reg(off, v)
        for off, v in vals.items():
            got = t.read_reg(off)
            assert got == v, (off, got, v)
        # DRAM: writes and reads of random lengths at unaligned addresses
        size = p["dram_bytes"]
        window = min(size, 8192)
        for i in range(p["dram_ops"]):
            if i == p["dram_ops"] // 2:
                calm.set()
            n = rng.choice([1, 2, 3, 7, 8, 9, rng.randrange(1, 700)])
            addr = rng.randrange(0, window - n) if i % 5 else size - n  # now and then the last bytes
            kind = rng.random()
            data = (
                bytes(rng.getrandbits(8) for _ in range(n))
                if kind < 0.5
                else bytes(rng.choice([0, 0, 1, 255]) for _ in range(n))
                if kind < 0.8
                else bytes([rng.randrange(1, 256)]) * n  # long runs without a zero
            )
            t.write_dram(addr, data)
            ref[addr : addr + n] = data
            a = rng.randrange(0, window - 1)
            m = rng.randrange(1, min(window - a, 600))
            got = t.read_dram(a, m)
            assert got == bytes(ref[a : a + m]), f"read_dram({a:#x}, {m}) differs"
            got = t.read_dram(addr, n)
            assert got == data, f"read back of write_dram({addr:#x}, {n}) differs"
        # NOW is monotonic
        times = [t.now() for _ in range(4)]
        assert all(b > a for a, b in zip(times, times[1:], strict=False)), times
        # WAIT: an idle core waits the whole limit
        assert t.wait(500) == 500
        # a running core (the model stops it after RUN_POLLS STATUS reads)
        t.write_reg(STATUS, int(Status.RUNNING))
        first = t.wait(1000)
        assert first == 1000, first  # a limit before the stop: the slice is the limit
        rest = t.wait(None)
        assert 0 < rest and 14 * RUN_POLLS <= first + rest <= 17 * RUN_POLLS, (first, rest)
        assert t.read_reg(STATUS) == Status.DONE
        out["stats"] = t.stats
    finally:
        t.close()


@cocotb.test()
async def test_host_client(dut):
    b = Bench(dut)
    b.stall()
    await b.reset()
    cocotb.start_soon(b.core_model())
    p = b.p
    ref = bytearray(p["dram_bytes"])
    stream = QueueStream()
    out: dict = {}
    errors: list[BaseException] = []
    calm = threading.Event()

    def run():
        try:
            host_job(stream, p, ref, out, calm)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    th = threading.Thread(target=run, name="host", daemon=True)
    th.start()
    stalling = True
    while th.is_alive():
        await ClockCycles(dut.clk, 64)
        if stalling and calm.is_set():
            b.stall(False)
            stalling = False
        while True:
            try:
                b.src.write_nowait(stream.to_dev.get_nowait())
            except queue.Empty:
                break
        data = b.sink.read_nowait()
        if data:
            stream.from_dev.put(bytes(data))
    if errors:
        raise errors[0]
    stats = out["stats"]
    assert stats.retries == 0 and stats.damaged == 0 and stats.resend == 0, stats
    assert b.ram.read(0, p["dram_bytes"]) == bytes(ref), "DRAM differs from the host's reference"


@cocotb.test()
async def test_raw_frames(dut):
    b = Bench(dut)
    await b.reset()
    p = b.p
    D, MAXP = p["dram_bytes"], p["max_packet"]
    hello = MAGIC + struct.pack("<BIH", VERSION, D, MAXP)
    resend = encode_frame(0, RESEND, b"")[:-1]

    await b.call(100, HELLO, bytes([VERSION]), OK, hello)
    await b.call(101, HELLO, bytes([1]), BAD_VERSION, bytes([VERSION]))
    await b.call(102, HELLO, b"", BAD_LENGTH)

    # damaged frames: RESEND with sequence 0
    good = bytearray(encode_frame(103, READ_REG, struct.pack("<I", 0x20)))
    bad = bytearray(good)
    bad[3] ^= 0x10 if bad[3] != 0x10 else 0x20  # a flipped bit (no new zero)
    await b.send(bytes(bad))
    assert await b.reply() == resend
    await b.send(b"\x05\x01\x02\x00")  # a COBS block longer than the frame
    assert await b.reply() == resend
    await b.send(cobs_encode(b"\x01\x02\x03") + b"\x00")  # too short for sequence, command and CRC
    assert await b.reply() == resend
    await b.framing_error()
    await b.send(bytes(good))  # the framing error damaged this frame
    assert await b.reply() == resend
    await b.silent(b"\x00")  # an empty frame is no frame
    b.regs.write_dword(0x20, 0x11223344)
    await b.call(103, READ_REG, struct.pack("<I", 0x20), OK, struct.pack("<I", 0x11223344))

    # a repeated sequence number: the same reply, not executed again
    await b.call(104, WRITE_REG, struct.pack("<II", 0x24, 111), OK)
    b.regs.write_dword(0x24, 222)
    await b.call(104, WRITE_REG, struct.pack("<II", 0x24, 111), OK)
    assert b.regs.read_dword(0x24) == 222, "a repeated WRITE_REG was executed again"
    await b.call(105, READ_REG, struct.pack("<I", 0x24), OK, struct.pack("<I", 222))
    b.regs.write_dword(0x24, 333)
    await b.call(105, READ_REG, struct.pack("<I", 0x24), OK, struct.pack("<I", 222))  # from memory
    # older sequence numbers (modulo 2^16) are ignored; HELLO always runs
    await b.silent(encode_frame(104, WRITE_REG, struct.pack("<II", 0x24, 1)))
    await b.silent(encode_frame(105 - 0x7FFF, READ_REG, struct.pack("<I", 0x24)))
    assert b.regs.read_dword(0x24) == 333
    await b.call(105 - 0x8000, READ_REG, struct.pack("<I", 0x24), OK, struct.pack("<I", 333))  # newer
    await b.call(90, HELLO, bytes([VERSION]), OK, hello)
    # on around the wrap of the sequence number
    for seq in (0x4000, 0x8000, 0xC000, 0xFFFF, 0):
        await b.call(seq, READ_REG, struct.pack("<I", 0x24), OK, struct.pack("<I", 333))
    await b.silent(encode_frame(0xFFFF, READ_REG, struct.pack("<I", 0x24)))

    # bad lengths and unknown commands
    await b.call(1, READ_REG, b"\x00\x00\x00", BAD_LENGTH)
    await b.call(2, WRITE_REG, struct.pack("<I", 0), BAD_LENGTH)
    await b.call(3, NOW, b"\x00", BAD_LENGTH)
    await b.call(4, WAIT, b"", BAD_LENGTH)
    await b.call(5, READ_DRAM, struct.pack("<IH", 0, MAXP + 1), BAD_LENGTH)
    await b.call(6, READ_DRAM, struct.pack("<I", 0), BAD_LENGTH)
    await b.call(7, WRITE_DRAM, b"\x00\x00", BAD_LENGTH)
    await b.call(8, WRITE_DRAM, struct.pack("<I", 0) + bytes(MAXP + 1), BAD_LENGTH)
    await b.call(9, WRITE_DRAM, struct.pack("<I", 0) + bytes(4 * MAXP), BAD_LENGTH)  # beyond the buffer
    await b.call(10, 0, b"", BAD_COMMAND)
    await b.call(11, 9, b"\x01\x02", BAD_COMMAND)
    await b.call(12, 0xFF, b"", BAD_COMMAND)

    # addresses outside DRAM
    await b.call(20, READ_DRAM, struct.pack("<IH", D - 4, 8), BAD_ADDRESS)
    await b.call(21, READ_DRAM, struct.pack("<IH", 0xFFFFFFFF, 2), BAD_ADDRESS)
    await b.call(22, WRITE_DRAM, struct.pack("<I", D - 2) + b"abc", BAD_ADDRESS)
    await b.call(23, WRITE_DRAM, struct.pack("<I", D) + b"a", BAD_ADDRESS)
    await b.call(24, READ_DRAM, struct.pack("<IH", D, 0), OK)
    await b.call(25, WRITE_DRAM, struct.pack("<I", D - 3) + b"xyz", OK)
    await b.call(26, READ_DRAM, struct.pack("<IH", D - 4, 4), OK, b"\x00xyz")
    assert b.ram.read(D - 4, 4) == b"\x00xyz"

    # a full packet of non-zero bytes (COBS blocks of 254) and one of zeros
    blob = bytes(range(1, 256)) * (MAXP // 255 + 1)
    await b.call(30, WRITE_DRAM, struct.pack("<I", 5) + blob[:MAXP], OK)
    await b.call(31, READ_DRAM, struct.pack("<IH", 5, MAXP), OK, blob[:MAXP])
    await b.call(32, WRITE_DRAM, struct.pack("<I", 7) + bytes(MAXP), OK)
    await b.call(33, READ_DRAM, struct.pack("<IH", 4, MAXP), OK, b"\x00" + blob[:2] + bytes(MAXP - 3))

    # AXI error responses: status 5 without payload, the link goes on
    W = p["data_width"] // 8
    b.fault["dram"] = (0x1000, 0x1000 + W)
    await b.call(34, READ_DRAM, struct.pack("<IH", 0x1000 - 5, 2 * W), DEVICE_ERROR)
    await b.call(35, WRITE_DRAM, struct.pack("<I", 0x1001) + b"ab", DEVICE_ERROR)
    await b.call(36, READ_DRAM, struct.pack("<IH", 0x1000 + W, 3), OK, bytes(3))
    b.fault["dram"] = (0, 0)
    b.fault["regs"] = (0x30, 0x34)
    await b.call(37, READ_REG, struct.pack("<I", 0x30), DEVICE_ERROR)
    await b.call(38, WRITE_REG, struct.pack("<II", 0x30, 5), DEVICE_ERROR)
    await b.call(39, READ_REG, struct.pack("<I", 0x34), OK, bytes(4))
    b.fault["regs"] = (0, 0)

    # WAIT: idle core with a limit / without; running core: limit, irq, stop
    await b.call(40, WAIT, struct.pack("<I", 100), OK, struct.pack("<IB", 100, 0))
    await b.call(41, WAIT, struct.pack("<I", NO_LIMIT), OK, struct.pack("<IB", 0, 1))
    b.regs.write_dword(STATUS, int(Status.RUNNING))
    await b.call(42, WAIT, struct.pack("<I", 300), OK, struct.pack("<IB", 300, 0))
    await b.call(43, WAIT, struct.pack("<I", 0), OK, struct.pack("<IB", 0, 0))
    for seq, (event, at) in enumerate([("irq", 400), ("stop", 600)], 44):

        async def later(event=event, at=at):
            await RisingEdge(dut.m_axil_arvalid)  # the first STATUS read: the wait begins
            await ClockCycles(dut.clk, at)
            if event == "irq":
                dut.irq.value = 1
            else:
                b.regs.write_dword(STATUS, int(Status.DONE))

        cocotb.start_soon(later())
        await b.send(encode_frame(seq, WAIT, struct.pack("<I", NO_LIMIT)))
        got = await b.reply()
        frame = encode_frame(seq, OK, b"\x00" * 5)[:-1]
        assert got is not None and len(got) >= len(frame) - 2, got
        dec = decode_frame(got)
        assert dec is not None and dec[:2] == (seq, OK), dec
        passed, finished = struct.unpack("<IB", dec[2])
        assert at - 8 <= passed <= at + 40, (event, passed)
        assert finished == (event == "stop"), (event, finished)
        dut.irq.value = 0

    # NOW counts cycles since reset
    await b.send(encode_frame(50, NOW, b""))
    t_sent = b.now() - b.t_reset
    dec = decode_frame(await b.reply())
    assert dec is not None and dec[:2] == (50, OK)
    (now,) = struct.unpack("<Q", dec[2])
    assert t_sent - 50 <= now <= t_sent + 2000, (now, t_sent)
