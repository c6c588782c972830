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


@pytest.mark.rtl
@pytest.mark.xdist_group("rtl-icebreaker")
def test_matmul_rate_is_what_the_build_report_quotes():
    """The micro core's MAC rate in `npu build`'s report (MATMUL_CYCLES_PER_MAC) is measured: a
    4 x 4 x 256 MATMUL on the RTL takes that many cycles per MAC (within 10 %)."""
    from npu.config import ACC_BASE, get_config
    from npu.hdl.micro import MATMUL_CYCLES_PER_MAC
    from npu.isa import make
    from npu.sim.rtl.core import run_rtl
    from npu.sim.rtl.suite import _raw

    cfg = get_config("icebreaker")
    k = 256
    mm = make("matmul", a=0, b=4096, c=ACC_BASE, m=4, n=4, k=k, a_stride=k, b_stride=k, c_stride=16)
    (rec,) = run_rtl(cfg, [_raw("rate", [mm, make("end")])], fast_dram=True, stalls=True)
    assert rec.status == "DONE"
    per_mac = rec.counters["BUSY_MATRIX"] / (4 * 4 * k)
    assert abs(per_mac / MATMUL_CYCLES_PER_MAC - 1) < 0.1, per_mac
