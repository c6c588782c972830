"""The serial protocol v2 between a host and a board's UART bridge (docs/driver.md): commands,
status codes and framing. A contract: the host (`npu.driver.serial`), the RTL bridge
(`npu.hdl.boards.bridge`) and the test benches import it from here.

Every frame, both ways, is COBS-encoded and ends with a 0x00 delimiter, so a receiver finds the next
frame after any damage. Decoded, a frame is: sequence number (u16), command or status (u8), payload,
CRC-32 (u32, `binascii.crc32` of everything before it). Little-endian throughout.
"""

from __future__ import annotations

import binascii
import struct

VERSION = 2
HELLO, READ_REG, WRITE_REG, READ_DRAM, WRITE_DRAM, WAIT, NOW = range(1, 8)
COMMANDS = {HELLO: "HELLO", READ_REG: "READ_REG", WRITE_REG: "WRITE_REG", READ_DRAM: "READ_DRAM",
            WRITE_DRAM: "WRITE_DRAM", WAIT: "WAIT", NOW: "NOW"}  # fmt: skip
OK, BAD_VERSION, BAD_COMMAND, BAD_LENGTH, BAD_ADDRESS, DEVICE_ERROR, RESEND = range(7)
STATUS_TEXT = {
    BAD_VERSION: "protocol version not supported",
    BAD_COMMAND: "unknown command",
    BAD_LENGTH: "bad payload length",
    BAD_ADDRESS: "address outside DRAM",
    DEVICE_ERROR: "the device failed",
    RESEND: "a damaged request arrived",
}
MAGIC = b"NPUS"
MAX_CHUNK = 4096  # data bytes per DRAM packet
NO_LIMIT = 0xFFFFFFFF
WAIT_SLICE = 1 << 20  # device cycles one WAIT request may take at most (the host polls)


# -- framing ------------------------------------------------------------------------------------
def cobs_encode(data: bytes) -> bytes:
    """Consistent overhead byte stuffing: `data` without any 0x00 (the frame delimiter)."""
    out, block = bytearray(), bytearray()
    for b in data:
        if b == 0:
            out += bytes([len(block) + 1]) + block
            block.clear()
        else:
            block.append(b)
            if len(block) == 254:
                out += b"\xff" + block
                block.clear()
    out += bytes([len(block) + 1]) + block
    return bytes(out)


def cobs_decode(data: bytes) -> bytes:
    """The inverse of `cobs_encode`; ValueError on a malformed encoding."""
    out, i, n = bytearray(), 0, len(data)
    while i < n:
        code = data[i]
        if code == 0 or i + code > n or 0 in data[i + 1 : i + code]:
            raise ValueError("malformed COBS block")
        out += data[i + 1 : i + code]
        i += code
        if code < 0xFF and i < n:
            out.append(0)
    return bytes(out)


def encode_frame(seq: int, code: int, payload: bytes) -> bytes:
    """One frame on the wire: COBS(seq, code, payload, CRC-32) and the 0x00 delimiter."""
    body = struct.pack("<HB", seq & 0xFFFF, code) + payload
    return cobs_encode(body + struct.pack("<I", binascii.crc32(body))) + b"\x00"


def decode_frame(raw: bytes) -> tuple[int, int, bytes] | None:
    """(seq, code, payload) of a received frame (without its delimiter), None if it is damaged."""
    try:
        body = cobs_decode(raw)
    except ValueError:
        return None
    if len(body) < 7 or binascii.crc32(body[:-4]) != struct.unpack("<I", body[-4:])[0]:
        return None
    seq, code = struct.unpack("<HB", body[:3])
    return seq, code, body[3:-4]


class FrameReader:
    """Splits a byte stream into frames at 0x00 delimiters (oversized garbage is dropped)."""

    def __init__(self, limit: int = 2 * MAX_CHUNK):
        self.buf = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        frames = []
        while (i := self.buf.find(0)) >= 0:
            frames.append(bytes(self.buf[:i]))
            del self.buf[: i + 1]
        if len(self.buf) > self.limit:  # no delimiter for too long: noise, wait for the next one
            self.buf.clear()
        return frames
