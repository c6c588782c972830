"""The serial backend, protocol v2: a byte protocol for a UART bridge to a board (docs/driver.md).

`SerialTransport` is the host side. `serve` is the device side written in Python against any
transport: it is the reference the board's bridge follows, and the tests run the client against it
(with the golden model behind it) over a socket pair, through a proxy that injects faults.

The commands, status codes and framing are a contract shared with the RTL bridge:
`npu.serial_protocol`.

Reliability: the host gives each request a new sequence number and accepts only a reply with the
same number and a good CRC (stale, duplicated and damaged frames are dropped). Without such a reply
within the timeout, on a damaged frame, or on the bridge's RESEND (its answer to a damaged request,
sent with sequence number 0), it sends the same request again; the bridge remembers its
last reply and repeats it for a repeated sequence number instead of executing the request twice, so
every command is safe to retry. WAIT returns after a bounded slice of device time and the host polls,
so no single request takes long. After `retries` attempts the host raises TransportError; the link
stays usable (the next request has a new sequence number).
"""

from __future__ import annotations

import queue
import random
import struct
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO

from npu.config import NpuConfig
from npu.registers import Status
from npu.serial_protocol import (
    BAD_ADDRESS,
    BAD_COMMAND,
    BAD_LENGTH,
    BAD_VERSION,
    COMMANDS,
    DEVICE_ERROR,
    HELLO,
    MAGIC,
    MAX_CHUNK,
    NO_LIMIT,
    NOW,
    OK,
    READ_DRAM,
    READ_REG,
    RESEND,
    STATUS_TEXT,
    VERSION,
    WAIT,
    WAIT_SLICE,
    WRITE_DRAM,
    WRITE_REG,
    FrameReader,
    decode_frame,
    encode_frame,
)

from .transport import Transport, TransportError


def _read_chunk(stream: BinaryIO) -> bytes:
    """Whatever the stream has (at least one byte, blocking); b'' at its end or its own timeout."""
    read1 = getattr(stream, "read1", None)
    if read1 is not None:
        return read1(4096)
    return stream.read(max(1, getattr(stream, "in_waiting", 0) or 1))


# -- host side ----------------------------------------------------------------------------------
@dataclass
class LinkStats:
    requests: int = 0
    retries: int = 0
    timeouts: int = 0
    damaged: int = 0  # frames with a bad CRC or encoding
    stale: int = 0  # good frames with another sequence number (late or duplicated replies)
    resend: int = 0  # the bridge's requests to send again (it got a damaged frame)
    failures: int = 0  # requests given up as TransportError


class SerialTransport(Transport):
    """Host side of the protocol over a serial port (`port`: a device such as /dev/ttyUSB1 or a
    pyserial URL such as socket://host:port; needs pyserial) or any byte stream (`stream`).

    A reader thread receives frames, so a stream without a timeout cannot hang the host: every
    request waits at most `timeout_s` (doubling on each of its `retries`)."""

    def __init__(self, cfg: NpuConfig, port: str | None = None, baud: int = 3_000_000,
                 stream: BinaryIO | None = None, timeout_s: float = 1.0, retries: int = 6):  # fmt: skip
        self.cfg = cfg
        if stream is None:
            if port is None:
                raise TransportError("the serial backend needs port= (e.g. /dev/ttyUSB0) or stream=")
            try:
                import serial
            except ImportError:
                raise TransportError("the serial backend needs pyserial: pip install pyserial") from None
            try:
                stream = serial.serial_for_url(port, baud, timeout=0.05)
            except (serial.SerialException, ValueError) as e:
                raise TransportError(f"cannot open serial port {port}: {e}") from None
        self.stream = stream
        self.timeout_s, self.retries = timeout_s, retries
        self.stats = LinkStats()
        self._seq = random.randrange(1 << 16)
        self._frames: queue.Queue[bytes | None] = queue.Queue()
        self._closed = False
        self._reader = threading.Thread(target=self._receive, name="npu-serial-rx", daemon=True)
        self._reader.start()
        try:
            hello = self._call(HELLO, struct.pack("<B", VERSION))
        except TransportError as e:
            raise TransportError(f"no NPU bridge answers protocol v{VERSION} on the link: {e}") from None
        if len(hello) < 11 or hello[:4] != MAGIC:
            raise TransportError(f"no NPU bridge on the serial link (hello answered {hello!r})")
        version, self.dram_bytes, self.max_chunk = struct.unpack("<BIH", hello[4:11])
        if version != VERSION:
            raise TransportError(f"the bridge speaks protocol v{version}, this host v{VERSION}")
        self.max_chunk = min(self.max_chunk, MAX_CHUNK)

    def _receive(self) -> None:
        reader = FrameReader()
        while not self._closed:
            try:
                chunk = _read_chunk(self.stream)
            except TimeoutError:
                continue
            except (OSError, ValueError):
                break
            if not chunk:
                if getattr(self.stream, "timeout", None) is not None and not self._closed:
                    continue  # a pyserial read timeout, not the end of the stream
                break
            for f in reader.feed(chunk):
                self._frames.put(f)
        self._frames.put(None)

    def _call(self, cmd: int, payload: bytes) -> bytes:
        self._seq = (self._seq + 1) & 0xFFFF
        frame = encode_frame(self._seq, cmd, payload)
        self.stats.requests += 1
        timeout = self.timeout_s
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats.retries += 1
            try:
                self.stream.write(frame)
                self.stream.flush()
            except (OSError, ValueError) as e:
                raise TransportError(f"serial link write failed: {e}") from None
            reply = self._await(self._seq, time.monotonic() + timeout)
            if reply is not None:
                status, data = reply
                if status != OK:
                    raise TransportError(
                        f"serial bridge refused {COMMANDS[cmd]}: {STATUS_TEXT.get(status, status)}"
                    )
                return data
            timeout = min(2 * timeout, 8 * self.timeout_s)
        self.stats.failures += 1
        raise TransportError(
            f"no valid reply to {COMMANDS[cmd]} after {self.retries + 1} attempts "
            f"(timeouts {self.stats.timeouts}, damaged frames {self.stats.damaged}, stale {self.stats.stale})"
        )

    def _await(self, seq: int, deadline: float) -> tuple[int, bytes] | None:
        """Our reply, or None to send again (timeout, or a damaged frame that was probably it)."""
        while True:
            try:
                raw = self._frames.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stats.timeouts += 1
                return None
            if raw is None:
                self._frames.put(None)
                raise TransportError("the serial link was closed")
            got = decode_frame(raw)
            if got is None:
                if raw:
                    self.stats.damaged += 1
                    return None
                continue
            if got[1] == RESEND:
                self.stats.resend += 1
                return None
            if got[0] != seq:
                self.stats.stale += 1
                continue
            return got[1], got[2]

    def read_reg(self, offset: int) -> int:
        return struct.unpack("<I", self._call(READ_REG, struct.pack("<I", offset)))[0]

    def write_reg(self, offset: int, value: int) -> None:
        self._call(WRITE_REG, struct.pack("<II", offset, value & 0xFFFFFFFF))

    def read_dram(self, addr: int, n: int) -> bytes:
        out = bytearray()
        for off in range(0, n, self.max_chunk):
            k = min(self.max_chunk, n - off)
            data = self._call(READ_DRAM, struct.pack("<IH", addr + off, k))
            if len(data) != k:
                raise TransportError(f"READ_DRAM answered {len(data)} bytes for {k}")
            out += data
        return bytes(out)

    def write_dram(self, addr: int, data: bytes) -> None:
        for off in range(0, len(data), self.max_chunk):
            self._call(WRITE_DRAM, struct.pack("<I", addr + off) + bytes(data[off : off + self.max_chunk]))

    def wait(self, max_cycles: int | None) -> int:
        """Poll WAIT (each a bounded slice of device time) until the core stops or `max_cycles`."""
        total = 0
        while max_cycles is None or total < max_cycles:
            left = NO_LIMIT if max_cycles is None else min(max_cycles - total, NO_LIMIT - 1)
            passed, finished = struct.unpack("<IB", self._call(WAIT, struct.pack("<I", left)))
            total += passed
            if finished or passed == 0:
                break
        return total

    def now(self) -> int:
        return struct.unpack("<Q", self._call(NOW, b""))[0]

    def close(self) -> None:
        self._closed = True
        close = getattr(self.stream, "close", None)
        if close:
            close()


class SocketStream:
    """A connected socket as a byte stream for `SerialTransport` and `serve` (for a bridge reached
    over TCP, and the tests)."""

    def __init__(self, sock):
        self.sock = sock

    def read1(self, n: int) -> bytes:
        try:
            return self.sock.recv(n)
        except TimeoutError:
            raise
        except OSError:
            return b""

    read = read1

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.sock.close()


# -- device side --------------------------------------------------------------------------------
def serve(stream: BinaryIO, device: Transport, dram_bytes: int) -> None:
    """The bridge side: answer requests from `stream` with `device` until the stream closes.

    Damaged frames get no answer (the host retries); a repeated sequence number gets the cached
    reply again without executing the request twice."""
    reader = FrameReader()
    last: tuple[int, bytes] | None = None  # the last executed request's sequence number and reply
    while True:
        try:
            chunk = _read_chunk(stream)
        except OSError:
            return
        if not chunk:
            return
        for raw in reader.feed(chunk):
            got = decode_frame(raw)
            if got is None:
                if raw:  # damaged: ask for it again rather than let the host wait for its timeout
                    stream.write(encode_frame(0, RESEND, b""))
                    stream.flush()
                continue
            seq, cmd, payload = got
            age = None if last is None or cmd == HELLO else (last[0] - seq) & 0xFFFF
            if age == 0:
                reply = last[1]  # the host did not get our reply: repeat it, do not execute again
            elif age is not None and age < 0x8000:
                continue  # an old request arriving late: already answered
            else:
                status, data = _handle(device, dram_bytes, cmd, payload)
                reply = encode_frame(seq, status, data)
                last = (seq, reply)
            try:
                stream.write(reply)
                stream.flush()
            except OSError:
                return


def _handle(dev: Transport, dram_bytes: int, cmd: int, p: bytes) -> tuple[int, bytes]:
    try:
        if cmd == HELLO and len(p) == 1:
            if p[0] != VERSION:
                return BAD_VERSION, bytes([VERSION])
            return OK, MAGIC + struct.pack("<BIH", VERSION, dram_bytes, MAX_CHUNK)
        if cmd == READ_REG and len(p) == 4:
            return OK, struct.pack("<I", dev.read_reg(struct.unpack("<I", p)[0]))
        if cmd == WRITE_REG and len(p) == 8:
            dev.write_reg(*struct.unpack("<II", p))
            return OK, b""
        if cmd == READ_DRAM and len(p) == 6:
            addr, n = struct.unpack("<IH", p)
            if n > MAX_CHUNK:
                return BAD_LENGTH, b""
            if addr + n > dram_bytes:
                return BAD_ADDRESS, b""
            return OK, dev.read_dram(addr, n)
        if cmd == WRITE_DRAM and 4 <= len(p) <= 4 + MAX_CHUNK:
            addr = struct.unpack("<I", p[:4])[0]
            if addr + len(p) - 4 > dram_bytes:
                return BAD_ADDRESS, b""
            dev.write_dram(addr, p[4:])
            return OK, b""
        if cmd == WAIT and len(p) == 4:
            # a slice of at most WAIT_SLICE cycles; `finished`: the core stopped (or, with no limit,
            # was not running), so the host stops polling
            limit = struct.unpack("<I", p)[0]
            was_running = dev.status() == Status.RUNNING
            passed = dev.wait(min(limit, WAIT_SLICE)) if was_running or limit != NO_LIMIT else 0
            finished = dev.status() != Status.RUNNING and (was_running or limit == NO_LIMIT)
            return OK, struct.pack("<IB", passed, finished)
        if cmd == NOW and not p:
            return OK, struct.pack("<Q", dev.now())
        return (BAD_LENGTH if cmd in COMMANDS else BAD_COMMAND), b""
    except ValueError:
        return BAD_ADDRESS, b""
    except Exception:  # noqa: BLE001 - the bridge must answer whatever the device does
        return DEVICE_ERROR, b""
