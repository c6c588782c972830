"""The SDR SDRAM controller (hdl/mem/sdram.py) on the SDRAM model with timing checks, in cocotb.

Two builds carry random concurrent traffic against a reference memory with every AXI channel
stalling and refreshes falling inside bursts, then time a 256-beat read and write: 64-bit AXI at
100 MHz with CAS latency 2 and a short refresh interval (a refresh every 1.5 us), and 128-bit AXI
at 133 MHz with CAS latency 3, the chip's own refresh interval and the read capture of an
inverted chip clock (`read_delay=-1`). A third build has a controller whose tRCD is a cycle
shorter than the chip's: the model must catch it. The rest needs no simulator: cycle conversion
of the timings, the address map, the pins, and the model's rules command by command.
"""

import dataclasses
import gc
import json
import warnings
from types import SimpleNamespace

import pytest
from amaranth import Shape
from amaranth.back import verilog
from amaranth.hdl import Fragment, UnusedElaboratable

from npu.hdl.axi import FlatPorts
from npu.hdl.mem.sdram import (
    CMD_ACTIVE,
    CMD_LOAD_MODE,
    CMD_PRECHARGE,
    CMD_READ,
    CMD_REFRESH,
    CMD_WRITE,
    SdramController,
    SdramGeometry,
    SdramTiming,
)

pytestmark = pytest.mark.xdist_group("rtl-sdram")

TOP = "sdram_top"
FAST_INIT = {"t_init_us": 2.0}  # the power-up wait, shortened for simulation

BUILDS = {
    "w64-cl2": dict(
        width=64, clock_mhz=100.0, timing=dict(cas_latency=2, t_refi_ns=1500.0, **FAST_INIT), ops=70
    ),
    "w128-cl3": dict(
        width=128, clock_mhz=133.0, timing=dict(cas_latency=3, **FAST_INIT), read_delay=-1, ops=45
    ),
}


def sdram_verilog(width, clock_mhz, timing, read_delay=0) -> str:
    ctrl = SdramController(data_width=width, clock_mhz=clock_mhz, timing=timing, read_delay=read_delay)
    return verilog.convert(FlatPorts(ctrl, {"bus": "s_axi", "pins": "sdram"}), name=TOP, emit_src=False)


def run(name, spec, controller_timing, tmp_path):
    from npu.sim.rtl.hdlsim import build_and_test

    v = sdram_verilog(spec["width"], spec["clock_mhz"], controller_timing, spec.get("read_delay", 0))
    result = tmp_path / "result.json"
    env = {"SDRAM_CONFIG": json.dumps(spec), "SDRAM_RESULT": str(result)}
    build_and_test(v, TOP, "npu.sim.rtl.cocotb_sdram", name=f"sdram-{name}", extra_env=env, quiet=True)
    return json.loads(result.read_text())


@pytest.mark.rtl
@pytest.mark.parametrize("name", list(BUILDS))
def test_sdram_controller_random_traffic_and_throughput(name, tmp_path):
    spec = BUILDS[name]
    res = run(name, spec, SdramTiming(**spec["timing"]), tmp_path)
    traffic, tp = res["random_traffic"], res["read_throughput"]
    print(f"\n{name}: {json.dumps(traffic)}\n{name}: {json.dumps(tp)}")
    assert traffic["reads"] > 20 and traffic["writes"] > 20
    assert traffic["refresh"]["refreshes"] > 10
    # a word per cycle, but for the first access's latency, an ACTIVE per bank (a 4 KiB burst
    # touches four), and a refresh (precharge all, refresh, activate again) now and then
    rcd, rp, rfc = tp["cycles_rcd_rp_rfc"]
    for k in ("read_rows_closed", "read_again", "write"):
        r = tp[k]
        banks = -(-tp["sdram_words"] // 512)
        bound = tp["sdram_words"] + banks * (rcd + 1) + r["refreshes"] * (rp + rfc + rcd + 3) + 12
        assert r["cycles"] <= bound, (k, r, bound)


@pytest.mark.rtl
def test_sdram_model_catches_a_short_trcd(tmp_path):
    chip = SdramTiming(cas_latency=2, **FAST_INIT)
    spec = dict(width=32, clock_mhz=100.0, timing=dataclasses.asdict(chip), ops=0, expect_violation="tRCD")
    assert chip.cycles(100).rcd == 2
    short = dataclasses.replace(chip, t_rcd_ns=10.0)  # one cycle at 100 MHz
    res = run("w32-short-trcd", spec, short, tmp_path)
    assert "tRCD" in res["violations"] and "tRCD" in res["raised"]


def test_timing_cycles_round_minimums_up_and_maximums_down():
    t = SdramTiming()
    c = t.cycles(100)
    assert (c.rcd, c.rp, c.rfc, c.rc, c.ras, c.rrd, c.wr, c.mrd, c.cl) == (2, 2, 7, 7, 5, 2, 2, 2, 3)
    assert c.refi == 781 and c.init == 20_000 and c.ras_max == 10_000  # 7812.5 ns, 200 us, 100 us
    c = t.cycles(143)
    assert (c.rcd, c.rp, c.rfc, c.ras, c.wr) == (3, 3, 11, 7, 3)  # 2.86, 2.86, 10.01, 6.4, 2.1
    assert c.refi == 1117
    c = t.cycles(25)
    assert (c.rcd, c.rp, c.rfc, c.ras, c.wr, c.mrd) == (1, 1, 2, 2, 2, 2)  # never below a cycle / tWR 2 clk
    assert SdramTiming(t_refi_ns=1500).cycles(100).refi == 150


def test_timing_and_controller_reject_bad_parameters():
    with pytest.raises(ValueError, match="cas_latency"):
        SdramTiming(cas_latency=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # the half-made controllers
        with pytest.raises(ValueError, match="data_width=48"):
            SdramController(data_width=48)
        with pytest.raises(ValueError, match="too short"):
            SdramController(clock_mhz=100, timing=SdramTiming(t_refi_ns=100))
        with pytest.raises(ValueError, match="read_delay"):
            SdramController(read_delay=-2)
        gc.collect()


def test_geometry_address_map():
    g = SdramGeometry()
    assert g.size == 32 << 20 and g.addr_bits == 13 and g.bank_bits == 2
    assert g.split(0) == (0, 0, 0)
    assert g.split(511) == (0, 0, 511) and g.split(512) == (1, 0, 0)  # 1 KiB per bank and row
    assert g.split(2048) == (0, 1, 0)
    for w in (0, 12345, (1 << 24) - 1):
        assert g.join(*g.split(w)) == w


def test_pins_and_bus_of_the_controller():
    ctrl = SdramController(data_width=128)
    Fragment.get(ctrl, None)  # elaborates
    pins = ctrl.signature.members["pins"].signature.members
    assert {n: (m.flow.name, Shape.cast(m.shape).width) for n, m in pins.items()} == {
        "clk_en": ("Out", 1), "cs_n": ("Out", 1), "we_n": ("Out", 1), "ras_n": ("Out", 1),
        "cas_n": ("Out", 1), "a": ("Out", 13), "ba": ("Out", 2), "dqm": ("Out", 2),
        "dq_o": ("Out", 16), "dq_oe": ("Out", 1), "dq_i": ("In", 16),
    }  # fmt: skip
    bus = ctrl.signature.members["bus"]
    assert bus.flow.name == "In" and bus.signature.data_width == 128


# ---- the SDRAM model's rules, command by command (no simulator) ----

PIN_NAMES = ("clk_en", "cs_n", "ras_n", "cas_n", "we_n", "a", "ba", "dqm", "dq_o", "dq_oe", "dq_i")
#: 100 MHz, CAS latency 2: tRCD 2, tRP 2, tRFC 7, tRC 9, tRAS 5, tRRD 2, tWR 2, tMRD 2, 100 cycles
#: of power-up wait, tREFI 150
MODEL_TIMING = SdramTiming(cas_latency=2, t_init_us=1.0, t_rc_ns=90.0, t_refi_ns=1500.0)


class _Pin:
    value = 0


def _model():
    from npu.sim.rtl.sdram_model import SdramModel

    dut = SimpleNamespace(**{f"sdram_{n}": _Pin() for n in PIN_NAMES})
    return SdramModel(dut, None, timing=MODEL_TIMING, clock_mhz=100.0, max_refresh_gap=150)


def _cmd(mdl, k, code, *, ba=0, a=0, dq=0, dqm=0, oe=0):
    for name, v in (("ba", ba), ("a", a), ("dq_o", dq), ("dqm", dqm), ("dq_oe", oe)):
        mdl.pin[name].value = v
    mdl.apply(k, code)


def _init(mdl) -> int:
    """The power-up sequence; the first cycle any command may follow."""
    _cmd(mdl, 101, CMD_PRECHARGE, a=1 << 10)
    _cmd(mdl, 103, CMD_REFRESH)
    _cmd(mdl, 110, CMD_REFRESH)
    _cmd(mdl, 117, CMD_LOAD_MODE, a=2 << 4)
    return 119


def test_model_accepts_a_legal_sequence_and_keeps_data():
    from npu.sim.rtl.sdram_model import initial_word

    mdl = _model()
    g = mdl.g
    k = _init(mdl)
    _cmd(mdl, k, CMD_ACTIVE, ba=1, a=5)
    _cmd(mdl, k + 2, CMD_ACTIVE, ba=2, a=6)
    _cmd(mdl, k + 3, CMD_WRITE, ba=1, a=7, dq=0xBEEF, dqm=0b10, oe=1)  # the high byte masked
    _cmd(mdl, k + 4, CMD_READ, ba=1, a=7)
    _cmd(mdl, k + 5, CMD_READ, ba=2, a=0)
    assert mdl.out[k + 6] == (initial_word(g, 1, 5, 7) & 0xFF00) | 0xEF  # CAS latency 2
    assert mdl.out[k + 7] == initial_word(g, 2, 6, 0)
    _cmd(mdl, k + 6, CMD_PRECHARGE, ba=1)
    _cmd(mdl, k + 9, CMD_ACTIVE, ba=1, a=9)  # tRP and tRC met
    _cmd(mdl, k + 14, CMD_PRECHARGE, a=1 << 10)
    _cmd(mdl, k + 18, CMD_REFRESH)  # tRP after the precharge, tRC after the last ACTIVE
    _cmd(mdl, k + 25, CMD_ACTIVE, ba=1, a=5)
    _cmd(mdl, k + 27, CMD_READ, ba=1, a=7)
    assert mdl.out[k + 29] == (initial_word(g, 1, 5, 7) & 0xFF00) | 0xEF
    mdl.check()
    assert not mdl.violations and mdl.refreshes == 1


@pytest.mark.parametrize(
    "rule",
    [
        "tRCD", "tRP", "tRAS", "tWR", "tRC", "tRRD", "tRFC", "tMRD", "no open row",
        "ACTIVE to an open bank", "initialisation order", "power-up wait", "REFRESH with a bank open",
        "mode", "WRITE without DQ driven", "refresh interval",
    ],
)  # fmt: skip
def test_model_catches(rule):
    from npu.sim.rtl.sdram_model import SdramViolation

    mdl = _model()
    with pytest.raises(SdramViolation) as e:
        if rule == "power-up wait":
            _cmd(mdl, 50, CMD_PRECHARGE, a=1 << 10)
        if rule == "initialisation order":
            _cmd(mdl, 101, CMD_PRECHARGE, a=1 << 10)
            _cmd(mdl, 110, CMD_ACTIVE)
        if rule == "mode":
            _cmd(mdl, 101, CMD_PRECHARGE, a=1 << 10)
            _cmd(mdl, 103, CMD_REFRESH)
            _cmd(mdl, 110, CMD_REFRESH)
            _cmd(mdl, 117, CMD_LOAD_MODE, a=3 << 4)  # CAS latency 3 for a model of 2
        k = _init(mdl)
        if rule == "tRCD":
            _cmd(mdl, k, CMD_ACTIVE)
            _cmd(mdl, k + 1, CMD_READ)
        if rule == "tRP":
            _cmd(mdl, k, CMD_ACTIVE)
            _cmd(mdl, k + 5, CMD_PRECHARGE)
            _cmd(mdl, k + 6, CMD_ACTIVE)
        if rule == "tRAS":
            _cmd(mdl, k, CMD_ACTIVE)
            _cmd(mdl, k + 4, CMD_PRECHARGE)
        if rule == "tWR":
            _cmd(mdl, k, CMD_ACTIVE)
            _cmd(mdl, k + 5, CMD_WRITE, oe=1)
            _cmd(mdl, k + 6, CMD_PRECHARGE)
        if rule == "tRC":
            _cmd(mdl, k, CMD_ACTIVE)
            _cmd(mdl, k + 5, CMD_PRECHARGE)
            _cmd(mdl, k + 7, CMD_ACTIVE)  # tRP met, tRC (9) not
        if rule == "tRRD":
            _cmd(mdl, k, CMD_ACTIVE, ba=0)
            _cmd(mdl, k + 1, CMD_ACTIVE, ba=1)
        if rule == "tRFC":
            _cmd(mdl, k, CMD_REFRESH)
            _cmd(mdl, k + 6, CMD_ACTIVE)
        if rule == "tMRD":
            _cmd(mdl, k - 1, CMD_ACTIVE)
        if rule == "no open row":
            _cmd(mdl, k, CMD_WRITE, ba=3, oe=1)
        if rule == "ACTIVE to an open bank":
            _cmd(mdl, k, CMD_ACTIVE, ba=2, a=1)
            _cmd(mdl, k + 20, CMD_ACTIVE, ba=2, a=2)
        if rule == "REFRESH with a bank open":
            _cmd(mdl, k, CMD_ACTIVE)
            _cmd(mdl, k + 20, CMD_REFRESH)
        if rule == "WRITE without DQ driven":
            _cmd(mdl, k, CMD_ACTIVE)
            _cmd(mdl, k + 2, CMD_WRITE, oe=0)
        if rule == "refresh interval":
            _cmd(mdl, k + 100, CMD_REFRESH)
            mdl.check()  # fine so far
            _cmd(mdl, k + 251, CMD_REFRESH)  # 151 cycles after the last
    assert e.value.rule == rule, e.value
