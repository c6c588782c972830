"""The typed manifest: round trips, and a checksum-valid file with a bad field is refused by name."""

import copy
import dataclasses
import hashlib
import json

import numpy as np
import pytest

from npu.config import get_config
from npu.container import (
    HEADER,
    MAGIC,
    VERSION,
    CancelPoint,
    Container,
    ContainerError,
    DramImage,
    HostIO,
    HostStep,
    HostTensor,
    Layer,
    Manifest,
    NpuSegment,
    ProgramInfo,
    TensorDesc,
    relocate,
)
from npu.isa import Opcode, decode_program, encode_program, make
from npu.tensors import Layout

TINY_ID = get_config("tiny").config_id


def _manifest() -> Manifest:
    x = TensorDesc("x", [1, 3, 4, 4], 0.05, -2, 0x1000, Layout.hwc((1, 3, 4, 4), 8))
    y = TensorDesc("y", [1, 10], 0.1, 0, 0x2000, Layout.dense((1, 10)))
    return Manifest(
        config="tiny",
        program=ProgramInfo(0x4000, 3),
        dram=[DramImage(0x3000, "dram0")],
        inputs=[x],
        outputs=[y, HostTensor("p", [1, 10])],
        segments=[
            NpuSegment(0, 2),
            HostStep("host1", [HostIO("y", y), HostIO("z", None)], [], ["sm (Softmax)"]),
        ],
        layers=[
            Layer("c", "Conv", "npu", [1, 10], pc=[0, 2], est_cycles=9, compute_cycles=9, dma_cycles=4),
            Layer("sm", "Softmax", "host", [1, 10], reason="not an NPU operator"),
        ],
        cancel_points=[CancelPoint(0, 1, "interval", 0, 5, [[0, 64]], 64, 3, 3)],
    )


def _file(raw: dict, blobs: dict[str, bytes]) -> bytes:
    """A container with a checksum that matches whatever the manifest says."""
    payload, index = b"", {}
    for name, data in blobs.items():
        index[name] = {"offset": len(payload), "length": len(data)}
        payload += data
    mb = json.dumps({**raw, "blobs": index}).encode()
    digest = hashlib.sha256(mb + payload).digest()
    return HEADER.pack(MAGIC, VERSION, 0, TINY_ID, len(mb), len(payload), digest) + mb + payload


BLOBS = {"program": encode_program([make("end")] * 3), "dram0": b"\1\2", "host1": b"onnx"}


def test_manifest_round_trips_through_json_and_bytes():
    man = _manifest()
    assert Manifest.from_json(json.loads(json.dumps(man.to_json()))) == man
    c = Container.from_bytes(Container(TINY_ID, man, dict(BLOBS)).to_bytes())
    assert c.manifest == man and c.blobs == BLOBS and c.config_id == TINY_ID
    # unset optional fields are left out of the file
    assert "pc" not in man.to_json()["layers"][1] and "reason" not in man.to_json()["layers"][0]


@pytest.mark.parametrize(
    "key", [f.name for f in dataclasses.fields(Manifest) if f.default is dataclasses.MISSING]
)
def test_a_missing_top_level_field_is_named(key):
    raw = _manifest().to_json()
    del raw[key]
    with pytest.raises(ContainerError, match=rf"m\.npub: manifest\.{key}: missing"):
        Container.from_bytes(_file(raw, BLOBS), "m.npub")


@pytest.mark.parametrize(
    "path,value,message",
    [
        (("program", "base"), "0x4000", r"manifest\.program\.base: expected int"),
        (("inputs", 0, "scale"), None, r"manifest\.inputs\[0\]\.scale: expected a number, found None"),
        (("inputs", 0, "layout", "kind"), "chw", r"manifest\.inputs\[0\]\.layout: not a tensor layout"),
        (("segments", 1, "kind"), "gpu", r"manifest\.segments\[1\]\.kind: 'gpu' is not one of"),
        (("segments", 1, "inputs", 0, "tensor", "addr"), True, r"segments\[1\]\.inputs\[0\]\.tensor\.addr"),
        (("layers", 0, "placement"), "fpga", r"manifest\.layers\[0\]\.placement: 'fpga' is not one of"),
        (
            ("cancel_points", 0, "live_ranges"),
            5,
            r"manifest\.cancel_points\[0\]\.live_ranges: expected a list",
        ),
        (("dram",), {}, r"manifest\.dram: expected a list"),
    ],
)
def test_a_mistyped_field_is_named(path, value, message):
    raw = _manifest().to_json()
    d = raw
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(ContainerError, match=message):
        Container.from_bytes(_file(raw, BLOBS))


def test_a_missing_nested_field_is_named():
    raw = _manifest().to_json()
    del raw["cancel_points"][0]["live_bytes"]
    with pytest.raises(ContainerError, match=r"manifest\.cancel_points\[0\]\.live_bytes: missing"):
        Container.from_bytes(_file(raw, BLOBS))


def test_blobs_the_manifest_uses_must_exist_and_fit():
    raw = _manifest().to_json()
    with pytest.raises(ContainerError, match="no blob 'host1'"):
        Container.from_bytes(_file(raw, {k: v for k, v in BLOBS.items() if k != "host1"}))
    mb = json.dumps({**raw, "blobs": {"program": {"offset": 0, "length": 999}}}).encode()
    with pytest.raises(ContainerError, match=r"manifest\.blobs\.program: .* outside the 0-byte payload"):
        Container.from_bytes(_signed(mb))
    with pytest.raises(ContainerError, match="not a JSON object"):
        Container.from_bytes(_signed(b"[1, 2]"))


def _signed(mb: bytes) -> bytes:
    """A container of just a manifest, with a matching checksum."""
    return HEADER.pack(MAGIC, VERSION, 0, TINY_ID, len(mb), 0, hashlib.sha256(mb).digest()) + mb


def test_relocate_moves_every_dram_address():
    man = _manifest()
    prog = encode_program([make("load", spad=0, dram=0x1000, rows=1, cols=16), make("end")])
    moved, prog2 = relocate(man, prog, 0x10000)
    assert moved.program.base == 0x14000 and moved.dram[0].addr == 0x13000
    assert [t.addr for t in moved.tensors()] == [t.addr + 0x10000 for t in man.tensors()]
    assert man.program.base == 0x4000  # the original is untouched
    ld = decode_program(prog2)[0]
    assert ld.op == Opcode.LOAD and ld.fields["dram"] == 0x11000


def test_a_compiled_model_survives_the_file(tmp_path):
    from npu.compiler import compile_onnx
    from tests.compiler.test_gemm_mlp import mlp_onnx

    rng = np.random.default_rng(1)
    path = mlp_onnx(tmp_path / "m.onnx", [rng.normal(0, 0.3, (8, 6))], [rng.normal(0, 0.1, 6)], 2)
    cm = compile_onnx(path, "tiny", calib=rng.normal(size=(16, 8)).astype(np.float32))
    c = cm.to_container()
    c.save(tmp_path / "m.npub")
    back = Container.load(tmp_path / "m.npub")
    assert back.manifest == cm.manifest
    assert copy.deepcopy(back.manifest).to_json() == c.manifest.to_json()


def test_reserved_header_bytes_and_config_id_are_checked(tmp_path):
    from npu.container import HEADER

    blob = bytearray(Container(TINY_ID, _manifest(), dict(BLOBS)).to_bytes())
    bad = bytes(blob[:6]) + b"\x01\x00" + bytes(blob[8:])
    with pytest.raises(ContainerError, match="reserved header field is 0x0001"):
        Container.from_bytes(bad)
    fields = list(HEADER.unpack_from(blob))
    fields[3] ^= 1  # another configuration id than the manifest's preset
    with pytest.raises(ContainerError, match="header configuration id"):
        Container.from_bytes(HEADER.pack(*fields) + bytes(blob[HEADER.size :]))
