"""The RTL serial bridge (hdl/boards/bridge.py) in cocotb: the unchanged host client against it over
the UART pins, and hand-made frames (damaged, repeated, old, bad length, unknown command, address
outside DRAM, unsupported version, WAIT, NOW) checked byte for byte against the reference encoder.

The bench is sim/rtl/cocotb_bridge.py: cocotbext-axi's AxiRam as DRAM, an AxiLiteRam as the registers,
cocotbext-uart at 4 to 8 clock cycles per bit.
"""

import json

import pytest

from npu.sim.rtl.cocotb_bridge import bridge_top_verilog
from npu.sim.rtl.hdlsim import build_and_test

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-bridge")]


def run_bench(p: dict, testcase: str | None = None) -> None:
    build_and_test(
        bridge_top_verilog(p),
        "bridge_top",
        "npu.sim.rtl.cocotb_bridge",
        name=f"bridge-w{p['data_width']}-p{p['max_packet']}",
        testcase=testcase,
        extra_env={"NPU_BRIDGE": json.dumps(p)},
        quiet=True,
    )


@pytest.mark.parametrize(
    "data_width, max_packet, divisor, dram_ops",
    [(64, 256, 8, 12), (32, 64, 4, 4), (128, 256, 5, 4)],
    ids=["w64", "w32", "w128"],
)
def test_bridge(data_width, max_packet, divisor, dram_ops):
    run_bench(
        {
            "data_width": data_width,
            "max_packet": max_packet,
            "divisor": divisor,
            "dram_bytes": 64 * 1024,
            "dram_ops": dram_ops,
        }
    )
