"""The command ring on the RTL core against the golden model: the same host code (npu.sim.
ring_scenarios) drives both through the transport interface; everything the host sees must agree
(data bit for bit, statuses, error codes and pcs, fence counts, RING_HEAD, pauses); cycles are
reported side by side."""

import pytest

from npu.config import get_config
from npu.driver.rtl import run_on_rtl
from npu.driver.transport import ModelTransport
from npu.sim.ring_scenarios import all_scenarios

pytestmark = pytest.mark.rtl


def _strip(rec):
    if isinstance(rec, list):
        return [_strip(r) for r in rec]
    return {k: v for k, v in rec.items() if k != "cycles"}


def test_ring_scenarios_rtl_match_the_model():
    cfg = get_config("tiny")
    model = all_scenarios(ModelTransport(cfg))
    rtl = run_on_rtl(all_scenarios, config=cfg, dram_bytes=cfg.dram_bytes)
    for name in model:
        assert _strip(rtl[name]) == _strip(model[name]), name
    for name in ("racing_8", "racing_4", "empty_wait", "pause_every_point"):
        assert rtl[name]["match"], name
        m, r = model[name]["cycles"], rtl[name]["cycles"]
        print(f"{name}: model {m} cycles, RTL {r} cycles ({r / m:.3f})")
