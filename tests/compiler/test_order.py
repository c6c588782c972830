"""Order search: key nodes, subgraphs, exhaustive vs partitioned search, and programs in
a searched order computing the same results."""

import json
import time

import numpy as np
import onnx

from npu.cli import main
from npu.compiler.cleanup import cleanup
from npu.compiler.lower import lower
from npu.compiler.order import CostModel, key_nodes, pieces, search_order, subgraphs, topo_orders
from npu.compiler.quantize import quantize_float_model
from npu.config import get_config
from npu.models.builder import Net


def test_key_nodes_of_a_diamond_chain():
    # 0 -> {1, 2} -> 3 -> 4 -> {5 -> 6, 7} -> 8
    deps = [set(), {0}, {0}, {1, 2}, {3}, {4}, {5}, {4}, {6, 7}]
    assert key_nodes(deps) == [0, 3, 4, 8]
    assert subgraphs(deps, merge_below=1) == [[0], [1, 2, 3], [4], [5, 6, 7, 8]]
    assert subgraphs(deps, merge_below=3) == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    orders = list(topo_orders([5, 6, 7, 8], deps))
    assert len(orders) == len({tuple(o) for o in orders}) == 3
    assert all(o.index(5) < o.index(6) and o[-1] == 8 for o in orders)


def test_a_large_subgraph_is_cut_into_runs_of_few_orders_where_fewest_dependencies_cross():
    # a backbone chain 0..11 whose taps 2, 5, 8 feed a neck (12, 13, 14) that ends in 15: no key
    # node between 2 and 15, thousands of orders
    deps = [set()] + [{i - 1} for i in range(1, 12)] + [{2}, {5}, {8}, {11, 12, 13, 14}]
    g = list(range(16))
    assert key_nodes(deps) == [0, 1, 2, 15]
    parts = pieces(g, deps, limit=6)
    assert [v for p in parts for v in p] == g and len(parts) > 1
    for p in parts:
        assert len(p) < 6 or len(list(topo_orders(p, deps))) <= 6
    # every order made of the runs' own orders keeps every dependency
    for p in parts:
        for o in topo_orders(p, deps):
            order = [v for q in parts for v in (o if q is p else q)]
            assert all(order.index(d) < order.index(v) for v in order for d in deps[v])
    assert pieces(g, deps, limit=10**6) == [g]


def _branchy():
    n = Net("branchy", (1, 8, 12, 12), seed=0)
    x = n.conv(n.input, 16, 3)
    for _ in range(2):
        a = n.conv(x, 16, 1)
        b = n.conv(n.conv(x, 8, 1), 16, 3)
        c = n.conv(n.maxpool(x, 3, 1, 1), 8, 1)
        x = n.conv(n.concat([a, b, c]), 16, 1)
    return n.model([x])


def test_exhaustive_and_partitioned_search_find_the_same_best_cost():
    model = _branchy()
    calib = np.random.default_rng(0).normal(size=(8, 8, 12, 12)).astype(np.float32)
    low = lower(quantize_float_model(cleanup(model), calib), get_config("default"))
    full = search_order(low, partition=False, exhaustive_limit=10**6, budget_s=None, min_gain=0)
    part = search_order(low, partition=True, exhaustive_limit=10**6, budget_s=None, min_gain=0)
    assert full.subgraphs[0].method == "exhaustive" and full.subgraphs[0].orders == 900
    assert len(part.subgraphs) >= 2 and all(s.method in ("exhaustive", "single") for s in part.subgraphs)
    cost = CostModel(low)
    assert cost.cycles(full.order) == cost.cycles(part.order)
    assert cost.cycles(part.order) <= cost.cycles(list(range(len(low.frags))))
    # the partition evaluates fewer orders than the whole graph's search (its time: `npu bench order`)
    assert sum(s.evaluated for s in part.subgraphs) < full.subgraphs[0].evaluated


def test_a_gain_within_the_cost_models_error_keeps_the_onnx_order():
    model = _branchy()
    calib = np.random.default_rng(0).normal(size=(8, 8, 12, 12)).astype(np.float32)
    low = lower(quantize_float_model(cleanup(model), calib), get_config("default"))
    found = search_order(low, min_gain=0)
    gains = [s.default_cycles - s.best_cycles for s in found.subgraphs]
    assert found.order != list(range(len(low.frags))) and max(gains) > 0
    # each subgraph's best order is taken only where it saves at least min_gain of its cycles
    share = max(g / s.default_cycles for g, s in zip(gains, found.subgraphs, strict=True) if g > 0)
    kept = search_order(low, min_gain=share * 1.01)
    assert kept.order == list(range(len(low.frags))) and kept.predicted_gain == 0
    assert any("ONNX order kept" in s.method for s in kept.subgraphs)
    between = search_order(low, min_gain=share * 0.99)
    assert between.order != list(range(len(low.frags))) and 0 < between.predicted_gain <= found.predicted_gain


def test_no_order_goes_below_the_busiest_units_floor_and_none_is_searched_that_cannot_gain_enough():
    model = _branchy()
    calib = np.random.default_rng(0).normal(size=(8, 8, 12, 12)).astype(np.float32)
    low = lower(quantize_float_model(cleanup(model), calib), get_config("default"))
    cost = CostModel(low, cancel_points=False)
    for o in list(topo_orders(list(range(len(low.frags))), [f.deps for f in low.frags]))[:20]:
        c = cost.cycles(o)  # then `floor` is this run's busiest unit
        assert 0 < cost.floor <= c
    # a gain larger than any order can make: the subgraphs are timed in the ONNX order only
    none = search_order(low, min_gain=1.0)
    timed = [s for s in none.subgraphs if s.method != "single"]
    assert timed and all("not searched" in s.method and s.evaluated == 1 for s in timed)


def test_a_subgraph_too_costly_to_sample_within_the_budget_is_cut_into_runs():
    model = _branchy()
    calib = np.random.default_rng(0).normal(size=(8, 8, 12, 12)).astype(np.float32)
    low = lower(quantize_float_model(cleanup(model), calib), get_config("default"))
    # 900 orders: two samples of the whole graph fit a minute's budget, a million do not
    whole = search_order(low, partition=False, exhaustive_limit=10, samples=2, budget_s=60)
    assert [s.method.split()[0] for s in whole.subgraphs] == ["sampled"]
    cut = search_order(low, partition=False, exhaustive_limit=10, samples=10**6, budget_s=60)
    assert len(cut.subgraphs) > 1 and {s.method.split()[0] for s in cut.subgraphs} <= {"exhaustive", "single"}
    assert all(s.orders <= 10 or len(s.nodes) < 6 for s in cut.subgraphs)
    assert sorted(cut.order) == list(range(len(low.frags))) and not cut.timed_out


def test_every_subgraph_gets_its_share_of_the_budget(monkeypatch):
    """With too little time for every sample, each subgraph is searched for its share of the budget
    (by its estimated cycles) instead of the first ones taking it all and the rest keeping the ONNX
    order (an Inception-style net's modules)."""
    model = _branchy()
    calib = np.random.default_rng(0).normal(size=(8, 8, 12, 12)).astype(np.float32)
    low = lower(quantize_float_model(cleanup(model), calib), get_config("default"))
    cycles = CostModel.cycles

    def slow(self, order, parity=0):  # a large net's timing: 30 ms a candidate
        time.sleep(0.03)
        return cycles(self, order, parity)

    monkeypatch.setattr(CostModel, "cycles", slow)
    # 30 samples of a module fit the budget (sampled whole), those of both do not
    found = search_order(low, exhaustive_limit=5, samples=30, budget_s=1.5, min_gain=0)
    searched = [s for s in found.subgraphs if s.method != "single"]
    assert len(searched) >= 2 and not found.timed_out
    assert all(s.method.startswith("sampled") and s.evaluated > 1 for s in searched)
    assert any("its share of the budget" in s.method for s in searched)


def test_searched_order_gives_the_same_outputs(tmp_path):
    model = _branchy()
    calib = np.random.default_rng(0).normal(size=(8, 8, 12, 12)).astype(np.float32)
    x = np.random.default_rng(1).normal(size=(1, 8, 12, 12)).astype(np.float32)
    path = tmp_path / "b.onnx"
    onnx.save(model, str(path))
    from npu.compiler import compile_onnx

    searched = compile_onnx(path, calib=calib)
    default = compile_onnx(path, calib=calib, order="default")
    assert default.lowered.order == sorted(default.lowered.order)
    assert searched.lowered.order != default.lowered.order
    assert np.array_equal(searched.run_int8(x)[0], default.run_int8(x)[0])
    assert "subgraph 1" in searched.report() and "ONNX order" in default.report()


def test_bench_order_json(capsys):
    assert main(["bench", "order", "--models", "resnet_small", "--timeout", "5", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["models"][0]
    assert r["model"] == "resnet_small"
    assert r["searched_cycles"] <= r["default_cycles"]
    for k in ("default_cycles", "searched_cycles", "search_s", "search_s_unpartitioned"):
        assert k in r


def test_compile_report_lists_subgraphs(tmp_path, capsys):
    model = _branchy()
    path = tmp_path / "b.onnx"
    onnx.save(model, str(path))
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(4, 8, 12, 12)).astype(np.float32))
    assert main(["compile", str(path), "--calib", str(tmp_path / "c.npy"), "--report"]) == 0
    out = capsys.readouterr().out
    assert "predicted gain" in out and "subgraph 0" in out and "scratchpad peak" in out
