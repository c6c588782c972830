"""The micro core's MAC array (hdl/micro/mac.py): its DSP column's simulation model against the iCE40
primitive's (yosys' cells_sim.v) and against the arithmetic it stands for. The array itself runs in
every micro-core RTL suite (tests/hdl/test_core_rtl.py, the board simulation): MATMULs against the
golden model."""

import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from npu.hdl.micro.mac import MacColumn, primitive_source
from npu.sim.rtl.hdlsim import build_and_test

pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-mac")]


class _Both(wiring.Component):
    """The model and the primitives side by side on the same inputs."""

    def __init__(self):
        super().__init__(
            {
                "a": In(32),
                "b": In(32),
                "sub": In(1),
                "hi_model": Out(16),
                "lo_model": Out(16),
                "hi_prim": Out(16),
                "lo_prim": Out(16),
            }  # fmt: skip
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.model = model = MacColumn(model=True)
        m.submodules.prim = prim = MacColumn(model=False)
        for col in (model, prim):
            m.d.comb += [col.a.eq(self.a), col.b.eq(self.b), col.sub.eq(self.sub)]
        m.d.comb += [self.hi_model.eq(model.hi), self.lo_model.eq(model.lo),
                     self.hi_prim.eq(prim.hi), self.lo_prim.eq(prim.lo)]  # fmt: skip
        return m


def test_the_column_model_behaves_like_the_two_sb_mac16_it_stands_for():
    v = verilog.convert(_Both(), name="mac_column", emit_src=False) + primitive_source()
    build_and_test(v, "mac_column", "npu.sim.rtl.cocotb_mac", name="mac-column", quiet=True)


class _Files:
    """What `MacColumn` asks of a platform: a place for its black box's Verilog."""

    def __init__(self):
        self.extra_files = {}

    def add_file(self, name, content):
        self.extra_files[name] = content


def test_synthesis_keeps_the_column_configuration(tmp_path):
    """yosys' ice40_dsp pass rewrites any SB_MAC16 it meets as a plain 16 x 16 multiplier; the
    board flow (a black box through synthesis, renamed back after) must hand nextpnr the blocks as
    configured, which the simulation model stands for."""
    import json
    import subprocess

    from amaranth.back import rtlil

    from npu.hdl.boards.build import tool_env
    from npu.hdl.micro.mac import SCRIPT_AFTER_SYNTH

    files = _Files()
    (tmp_path / "col.il").write_text(rtlil.convert(MacColumn(model=False), name="col", platform=files))
    for name, text in files.extra_files.items():
        (tmp_path / name).write_text(text)
    script = (
        "".join(f"read_verilog {n}; " for n in files.extra_files)
        + f"read_rtlil col.il; synth_ice40 -dsp -top col; {SCRIPT_AFTER_SYNTH}; write_json col.json"
    )
    r = subprocess.run([tool_env("ice40")["YOSYS"], "-q", "-p", script], cwd=tmp_path, capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    cells = json.loads((tmp_path / "col.json").read_text())["modules"]["col"]["cells"]
    dsps = {name: c for name, c in cells.items() if c["type"] == "SB_MAC16"}
    assert len(dsps) == 2
    for i, name in enumerate(sorted(dsps)):
        want = dict(MacColumn.PARAMS, TOP_8x8_MULT_REG=i, BOT_8x8_MULT_REG=i)
        got = {k: int(v, 2) for k, v in dsps[name]["parameters"].items()}
        assert got == want, f"{name}: {got}"
