"""The same driver code on the RTL core (cocotb + Verilator): preemption at every cancellation point
with the NPU's own dump/restore programs, bit-identical to uninterrupted runs and to the model."""

import numpy as np
import pytest

from npu.driver import Npu
from npu.driver.bench import preempt_at_every_point
from npu.sim.rtl.transport import run_on_rtl

pytestmark = pytest.mark.rtl


def preempt_everywhere(transport, c_low, c_hi, x, xu):
    """Runs inside the simulation: a reference run, then a run paused at every point."""
    npu = Npu(transport=transport, config=c_low.manifest.config)
    low, hi = npu.load(c_low, "low"), npu.load(c_hi, "urgent")
    ref = low.run(x, int8=True)
    ref_hi = hi.run(xu, int8=True)
    got, records = preempt_at_every_point(npu, low, x, hi, xu)
    return ref, ref_hi, got, [(r.cp, r.live_bytes, r.dump_cycles, r.restore_cycles) for r in records]


@pytest.mark.parametrize("config", ["tiny", "banked"])
def test_preemption_on_the_rtl_is_bit_exact(config, request):
    """Also on the banked scratchpad: the compiled models keep weights in its upper half."""
    c_low, c_hi, x, xu = request.getfixturevalue(
        "small_models" if config == "tiny" else "small_models_banked"
    )
    ref, ref_hi, got, records = run_on_rtl(
        preempt_everywhere, c_low, c_hi, x, xu, config=config, dram_bytes=1 << 16
    )
    points = c_low.manifest.cancel_points
    assert [r[0] for r in records] == [p.id for p in points]
    assert any(r[1] > 0 and r[2] > 0 and r[3] > 0 for r in records)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    # and the RTL agrees with the golden model
    npu = Npu("model", config)
    low, hi = npu.load(c_low), npu.load(c_hi)
    assert all(np.array_equal(a, b) for a, b in zip(ref, low.run(x, int8=True), strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(ref_hi, hi.run(xu, int8=True), strict=True))


def test_int16_models_preempt_bit_exactly_on_the_rtl(small_models_int16):
    """Models compiled with int16 activations (int16 MATMULs, vector passes and padding) on the RTL
    core: preempted at every point, bit-identical to uninterrupted runs and to the golden model."""
    c_low, c_hi, x, xu = small_models_int16
    assert any(t.layout.elem == 2 for t in c_low.manifest.outputs + c_low.manifest.inputs)
    ref, ref_hi, got, records = run_on_rtl(
        preempt_everywhere, c_low, c_hi, x, xu, config="tiny", dram_bytes=1 << 16
    )
    assert [r[0] for r in records] == [p.id for p in c_low.manifest.cancel_points]
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    npu = Npu("model", "tiny")
    low, hi = npu.load(c_low), npu.load(c_hi)
    assert all(np.array_equal(a, b) for a, b in zip(ref, low.run(x, int8=True), strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(ref_hi, hi.run(xu, int8=True), strict=True))


def arrivals_scenario(transport, c_small, c_mlp, x_small, x_mlp, plan):
    """Runs inside the simulation: jobs of two models with the given (model, input index, priority,
    arrival) plan, arrival 0 included; their int8 outputs."""
    npu = Npu(transport=transport, config=c_small.manifest.config)
    models = {"small": npu.load(c_small), "mlp": npu.load(c_mlp)}
    xs = {"small": [x_small, x_small + 1], "mlp": [x_mlp, x_mlp * 2]}
    t0 = npu.tr.now()
    jobs = [models[m].submit(xs[m][k], priority=p, at=t0 + at, int8=True) for m, k, p, at in plan]
    npu.run_all()
    return [j.outputs[0] for j in jobs], [bool(j.preemptions) for j in jobs]


def test_random_arrivals_on_the_rtl_never_share_activations(small_models):
    """Two jobs of one model, the first started at once and preempted, the second urgent: each gets
    its own result (the defect: the second ran in the first's activation area)."""
    c_small, c_mlp, x, xm = small_models
    rng = np.random.default_rng(5)
    plan = [("small", 0, 0, 0), ("mlp", 0, 2, 300), ("small", 1, 3, 301)]
    for _ in range(3):
        m = str(rng.choice(["small", "mlp"]))
        plan.append((m, int(rng.integers(2)), int(rng.integers(4)), int(rng.integers(0, 3000))))
    outs, preempted = run_on_rtl(
        arrivals_scenario, c_small, c_mlp, x, xm, plan, config="tiny", dram_bytes=1 << 16
    )
    assert preempted[0], "the scenario needs the first job preempted"
    npu = Npu("model", "tiny")
    models = {"small": npu.load(c_small), "mlp": npu.load(c_mlp)}
    xs = {"small": [x, x + 1], "mlp": [xm, xm * 2]}
    for (m, k, _, _), out in zip(plan, outs, strict=True):
        assert np.array_equal(out, models[m].run(xs[m][k], int8=True)[0]), (m, k)


def test_npu_run_on_the_rtl(small_models, tmp_path, capsys):
    from npu.cli import main

    c_low, _, x, _ = small_models
    c_low.save(tmp_path / "m.npub")
    np.save(tmp_path / "x.npy", x)
    args = [
        "run",
        str(tmp_path / "m.npub"),
        "--input",
        str(tmp_path / "x.npy"),
        "--output",
        str(tmp_path / "y.npy"),
    ]
    assert main([*args, "--backend", "rtl"]) == 0
    y_rtl = np.load(tmp_path / "y.npy")
    assert main([*args, "--backend", "model"]) == 0
    assert np.array_equal(y_rtl, np.load(tmp_path / "y.npy"))
    assert "cycles" in capsys.readouterr().out
