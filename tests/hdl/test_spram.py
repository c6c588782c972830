"""The iCE40 SPRAM adapter (hdl/mem/spram.py) against a reference memory, in cocotb."""

import pytest
from amaranth.back import verilog

from npu.hdl.axi import FlatPorts
from npu.hdl.mem.spram import SPRAM_BYTES, SpramAxi
from npu.sim.rtl.hdlsim import build_and_test

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-spram")]


@pytest.mark.parametrize("width", [64, 32])
def test_spram_adapter_random_traffic(width):
    v = verilog.convert(
        FlatPorts(SpramAxi(width, sim=True), {"bus": "s_axi"}), name="spram_axi", emit_src=False
    )
    env = {"SPRAM_BYTES": str(SPRAM_BYTES), "SPRAM_BEAT": str(width // 8)}
    build_and_test(
        v, "spram_axi", "npu.sim.rtl.cocotb_spram", name=f"spram-{width}", extra_env=env, quiet=True
    )


def test_spram_adapter_rejects_other_widths():
    with pytest.raises(ValueError, match="data_width=128"):
        SpramAxi(128)
