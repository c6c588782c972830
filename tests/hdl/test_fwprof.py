"""The micro core's firmware profiler (`python -m npu.sim.rtl.fwprof`): cycles by firmware function."""

import pytest


def test_cycles_are_summed_by_the_function_holding_each_pc():
    from npu.sim.rtl.fwprof import by_function

    funcs = [(0x100, 0x20, "a"), (0x120, 0x10, "b"), (0x200, 8, "c")]
    pcs = {0x100: 3, 0x11C: 2, 0x120: 5, 0x130: 7, 0x204: 1, 0x50: 4}
    assert by_function(pcs, funcs) == {"?": 11, "b": 5, "a": 5, "c": 1}  # 0x130: past b, before c


def test_the_symbols_are_the_committed_images():
    pytest.importorskip("ziglang", reason="Zig's C compiler (the dev extra) rebuilds the firmware")
    from npu.hdl.micro.firmware import IMAGE, functions

    funcs = functions()
    names = {f[2] for f in funcs}
    assert {"start", "main", "check", "decode", "exec_matmul", "exec_load"} <= names
    assert all(0x10000 <= a and a + n <= 0x10000 + len(IMAGE.read_bytes()) for a, n, _ in funcs)


@pytest.mark.rtl
@pytest.mark.xdist_group("rtl-icebreaker")
def test_a_probe_profile_accounts_for_its_cycles():
    """A SYNC and a MATMUL on the icebreaker's RTL: every sampled cycle is in a firmware function
    (none outside the image), the run's CYCLES are among them, and the MATMUL's own kernel shows up
    only in its probe."""
    pytest.importorskip("ziglang", reason="Zig's C compiler (the dev extra) rebuilds the firmware")
    from npu.sim.rtl.fwprof import profile

    rows = {r["probe"]: r for r in profile(["sync x1", "matmul 4x4x16"])}
    for r in rows.values():
        assert r["sampled"] >= r["cycles"] > 1000, r["probe"]
        assert sum(r["functions"].values()) == r["sampled"] and "?" not in r["functions"], r["functions"]
        assert r["functions"].get("main", 0) > 0 and r["functions"].get("check", 0) > 0
    assert rows["matmul 4x4x16"]["functions"].get("exec_matmul", 0) > 0
    assert "exec_matmul" not in rows["sync x1"]["functions"]
