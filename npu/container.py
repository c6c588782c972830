"""The `.npub` program container (docs/container.md): one compiled model, ready for a device.

Layout (little-endian):

    offset  size  field
    0       4     magic b"NPUB"
    4       2     format version (1)
    6       2     reserved, 0
    8       4     configuration id the program was compiled for
    12      4     manifest length M (bytes of UTF-8 JSON)
    16      8     payload length P
    24      32    SHA-256 of manifest + payload
    56      M     manifest (JSON)
    56+M    P     payload (the blobs the manifest points into)
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"NPUB"
VERSION = 2
HEADER = struct.Struct("<4sHHIIQ32s")


class ContainerError(ValueError):
    """A file that is not a valid container; the message names the file and the problem."""


@dataclass
class Container:
    config_id: int
    manifest: dict
    blobs: dict[str, bytes] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        payload = bytearray()
        man = dict(self.manifest)
        index = {}
        for name, data in self.blobs.items():
            index[name] = {"offset": len(payload), "length": len(data)}
            payload += data
        man["blobs"] = index
        mb = json.dumps(man, sort_keys=True).encode()
        digest = hashlib.sha256(mb + bytes(payload)).digest()
        return HEADER.pack(MAGIC, VERSION, 0, self.config_id, len(mb), len(payload), digest) + mb + payload

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> Container:
        if len(data) < HEADER.size:
            raise ContainerError(f"{source}: {len(data)} bytes is too short for an .npub header")
        magic, version, _, config_id, mlen, plen, digest = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ContainerError(f"{source}: not an .npub container (magic {magic!r})")
        if version != VERSION:
            raise ContainerError(f"{source}: container format version {version}, this tool reads {VERSION}")
        body = data[HEADER.size :]
        if len(body) != mlen + plen:
            raise ContainerError(
                f"{source}: truncated or padded: header says {mlen + plen} bytes of body, found {len(body)}"
            )
        if hashlib.sha256(body).digest() != digest:
            raise ContainerError(f"{source}: checksum mismatch (the file is corrupt)")
        try:
            man = json.loads(body[:mlen])
        except ValueError as e:
            raise ContainerError(f"{source}: manifest is not JSON: {e}") from None
        payload = body[mlen:]
        blobs = {n: payload[i["offset"] : i["offset"] + i["length"]] for n, i in man.pop("blobs", {}).items()}
        return cls(config_id, man, blobs)

    @classmethod
    def load(cls, path: str | Path) -> Container:
        p = Path(path)
        try:
            return cls.from_bytes(p.read_bytes(), str(p))
        except FileNotFoundError:
            raise ContainerError(f"{p}: no such file") from None
