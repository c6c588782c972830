"""The ring scenarios shared with the RTL test, on the golden model: what the host must see."""

from npu.config import get_config
from npu.driver.transport import ModelTransport
from npu.sim.rtl.ring_scenarios import all_scenarios


def test_ring_scenarios_on_the_model():
    r = all_scenarios(ModelTransport(get_config("tiny")))
    for name in ("racing_8", "racing_4", "empty_wait", "pause_every_point"):
        assert r[name]["match"], name
        assert r[name]["status"] == "WAITING", (name, r[name])
    assert r["racing_8"]["fence_count"] == 3 and r["racing_4"]["fence_count"] == 2
    assert r["empty_wait"]["before"] == "WAITING"
    p = r["pause_every_point"]
    assert len(p["pauses"]) == p["points"] >= 2
    assert all(resume == head for _, resume, head in p["pauses"])
    # each WAITING's counters: one instruction dispatched more each time, the fence counted
    assert r["counters_at_waiting"]["seen"] == [("WAITING", 1, 0), ("WAITING", 2, 1), ("WAITING", 3, 1)]
    illegal, field, size = r["errors"]
    assert (illegal["status"], illegal["error_code"], illegal["error_pc"]) == ("ERROR", 1, 101)
    assert (field["status"], field["error_code"], field["error_pc"]) == ("ERROR", 2, 1)
    assert (size["status"], size["error_code"]) == ("ERROR", 5)
