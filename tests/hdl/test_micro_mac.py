"""The micro core's MAC engine (hdl/micro/mac.py): its DSP lane's simulation model against the
iCE40 primitive's (yosys' cells_sim.v). The engine itself runs in every micro-core RTL suite
(tests/hdl/test_core_rtl.py, the board simulation): MATMULs against the golden model."""

import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.hdl.micro.mac import Mac16, primitive_source
from npu.sim.rtl.hdlsim import build_and_test

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-mac")]


class _Pair(wiring.Component):
    """The model and the primitive side by side on the same inputs."""

    def __init__(self):
        super().__init__(
            {
                "a": In(16),
                "b": In(16),
                "a_load": In(1),
                "b_load": In(1),
                "acc": In(1),
                "clear": In(1),
                "o_model": Out(32),
                "o_prim": Out(32),
            }  # fmt: skip
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.model = model = Mac16(model=True)
        m.submodules.prim = prim = Mac16(model=False)
        for lane in (model, prim):
            for n in ("a", "b", "a_load", "b_load", "acc", "clear"):
                m.d.comb += getattr(lane, n).eq(getattr(self, n))
        m.d.comb += [self.o_model.eq(model.o), self.o_prim.eq(prim.o)]
        return m


def test_the_lane_model_behaves_like_the_sb_mac16_it_stands_for():
    v = verilog.convert(_Pair(), name="mac_pair", emit_src=False) + primitive_source()
    build_and_test(v, "mac_pair", "npu.sim.rtl.cocotb_mac", name="mac-pair", quiet=True)
