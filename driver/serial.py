"""The serial backend: a byte protocol for a UART bridge to a board (docs/driver.md, "Serial protocol").

`SerialTransport` is the host side. `serve` is the device side written in Python against any
transport: it is the reference the board's bridge firmware follows, and the tests run the client
against it over a socket pair with the golden model behind it.

Request:  0x5A, command (u8), length (u16 LE), payload, checksum (u8)
Response: 0xA5, status (u8), length (u16 LE), payload, checksum (u8)
The checksum is the low byte of the sum of every byte before it. Integers are little-endian.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from npu.config import NpuConfig

from .transport import Transport, TransportError

REQ, RESP = 0x5A, 0xA5
HELLO, READ_REG, WRITE_REG, READ_DRAM, WRITE_DRAM, WAIT, NOW = range(1, 8)
OK, BAD_CHECKSUM, BAD_COMMAND, BAD_LENGTH, BAD_ADDRESS = range(5)
STATUS_TEXT = {
    BAD_CHECKSUM: "checksum mismatch",
    BAD_COMMAND: "unknown command",
    BAD_LENGTH: "bad payload length",
    BAD_ADDRESS: "address outside DRAM",
}
MAX_CHUNK = 4096  # data bytes per DRAM packet
PROTOCOL_MAGIC = b"NPUS\x01"
NO_LIMIT = 0xFFFFFFFF


def encode_frame(head: int, code: int, payload: bytes) -> bytes:
    """One frame of the serial protocol (docs/driver.md): head, code, length, payload, checksum."""
    body = bytes([head, code]) + struct.pack("<H", len(payload)) + payload
    return body + bytes([sum(body) & 0xFF])


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = stream.read(n - len(out))
        if not chunk:
            raise TransportError(f"serial link closed or timed out ({len(out)} of {n} bytes)")
        out += chunk
    return out


def read_frame(stream: BinaryIO, head: int) -> tuple[int, bytes]:
    """Read one frame starting with `head`; its code and payload (TransportError on a bad frame)."""
    b = _read_exact(stream, 1)
    if b[0] != head:
        raise TransportError(f"serial framing error: expected 0x{head:02x}, got 0x{b[0]:02x}")
    hdr = _read_exact(stream, 3)
    code, n = hdr[0], struct.unpack("<H", hdr[1:])[0]
    payload = _read_exact(stream, n)
    chk = _read_exact(stream, 1)[0]
    if (sum(b + hdr + payload) & 0xFF) != chk:
        raise TransportError("serial checksum mismatch in a response")
    return code, payload


class SerialTransport(Transport):
    """Host side of the protocol over a serial port (`port`, needs pyserial) or any byte stream."""

    def __init__(self, cfg: NpuConfig, port: str | None = None, baud: int = 3_000_000,
                 stream: BinaryIO | None = None, timeout_s: float = 5.0):  # fmt: skip
        self.cfg = cfg
        if stream is None:
            if port is None:
                raise TransportError("the serial backend needs port= (e.g. /dev/ttyUSB0) or stream=")
            try:
                import serial
            except ImportError:
                raise TransportError("the serial backend needs pyserial: pip install pyserial") from None
            stream = serial.Serial(port, baud, timeout=timeout_s)
        self.stream = stream
        magic = self._call(HELLO, b"")
        if magic[:5] != PROTOCOL_MAGIC:
            raise TransportError(f"no NPU bridge on the serial link (hello answered {magic!r})")
        self.dram_bytes = struct.unpack("<I", magic[5:9])[0]

    def _call(self, cmd: int, payload: bytes) -> bytes:
        self.stream.write(encode_frame(REQ, cmd, payload))
        self.stream.flush()
        status, data = read_frame(self.stream, RESP)
        if status != OK:
            raise TransportError(f"serial bridge refused command {cmd}: {STATUS_TEXT.get(status, status)}")
        return data

    def read_reg(self, offset: int) -> int:
        return struct.unpack("<I", self._call(READ_REG, struct.pack("<I", offset)))[0]

    def write_reg(self, offset: int, value: int) -> None:
        self._call(WRITE_REG, struct.pack("<II", offset, value & 0xFFFFFFFF))

    def read_dram(self, addr: int, n: int) -> bytes:
        out = bytearray()
        for off in range(0, n, MAX_CHUNK):
            k = min(MAX_CHUNK, n - off)
            out += self._call(READ_DRAM, struct.pack("<IH", addr + off, k))
        return bytes(out)

    def write_dram(self, addr: int, data: bytes) -> None:
        for off in range(0, len(data), MAX_CHUNK):
            self._call(WRITE_DRAM, struct.pack("<I", addr + off) + bytes(data[off : off + MAX_CHUNK]))

    def wait(self, max_cycles: int | None) -> int:
        limit = NO_LIMIT if max_cycles is None else min(max_cycles, NO_LIMIT - 1)
        return struct.unpack("<I", self._call(WAIT, struct.pack("<I", limit)))[0]

    def now(self) -> int:
        return struct.unpack("<Q", self._call(NOW, b""))[0]

    def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if close:
            close()


def serve(stream: BinaryIO, device: Transport, dram_bytes: int) -> None:
    """The bridge side: answer requests from `stream` with `device` until the stream closes."""
    while True:
        try:
            b = stream.read(1)
        except OSError:
            return
        if not b:
            return
        if b[0] != REQ:
            continue  # resynchronise on the next request byte
        try:
            hdr = _read_exact(stream, 3)
            cmd, n = hdr[0], struct.unpack("<H", hdr[1:])[0]
            payload = _read_exact(stream, n)
            chk = _read_exact(stream, 1)[0]
        except TransportError:
            return
        if (sum(b + hdr + payload) & 0xFF) != chk:
            stream.write(encode_frame(RESP, BAD_CHECKSUM, b""))
        else:
            status, data = _handle(device, dram_bytes, cmd, payload)
            stream.write(encode_frame(RESP, status, data))
        stream.flush()


def _handle(dev: Transport, dram_bytes: int, cmd: int, p: bytes) -> tuple[int, bytes]:
    try:
        if cmd == HELLO:
            return OK, PROTOCOL_MAGIC + struct.pack("<I", dram_bytes)
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
            limit = struct.unpack("<I", p)[0]
            return OK, struct.pack("<I", dev.wait(None if limit == NO_LIMIT else limit))
        if cmd == NOW and not p:
            return OK, struct.pack("<Q", dev.now())
        if cmd in (HELLO, READ_REG, WRITE_REG, READ_DRAM, WRITE_DRAM, WAIT, NOW):
            return BAD_LENGTH, b""
        return BAD_COMMAND, b""
    except ValueError:
        return BAD_ADDRESS, b""
