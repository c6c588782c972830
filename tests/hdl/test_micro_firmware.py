"""The micro core's firmware: the committed image and header are what the sources build."""

import pytest

from npu.hdl.micro import firmware


def test_header_is_generated_from_the_isa():
    assert firmware.HEADER.read_text() == firmware.header(), "run `python -m npu.hdl.micro.firmware`"


def test_committed_image_is_what_the_sources_build(tmp_path):
    pytest.importorskip("ziglang", reason="Zig's C compiler (the dev extra) rebuilds the firmware")
    image = firmware.build(tmp_path / "firmware.bin", write_header=False)
    assert image == firmware.IMAGE.read_bytes(), "run `python -m npu.hdl.micro.firmware`"
    assert len(image) <= firmware.ROM_LIMIT


def test_a_config_the_micro_core_cannot_hold_is_refused():
    from npu.config import get_config
    from npu.hdl.micro.core import MicroCore

    with pytest.raises(ValueError, match="exceed"):
        MicroCore(get_config("icebreaker").replace(spad_bytes=64 * 1024))
    with pytest.raises(ValueError, match="32-bit"):
        MicroCore(get_config("tiny").replace(core="micro"))
