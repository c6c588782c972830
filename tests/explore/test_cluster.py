"""Scale-out on a real two-node Ray cluster on localhost (a head and one worker node, started by
cluster_run.py in a process of its own, so no test worker inherits Ray's client state): `npu dse`
and an `npu regress` shard pair give the results of the same runs in one process, and a worker node
lost mid-run loses no result (its tasks run again on the head)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the cluster extra is not installed")
# the regress shards run on the tiny RTL top: built once with the other tiny tests
pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-tiny")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("cluster")
    script = Path(__file__).with_name("cluster_run.py")
    root = Path(__file__).parents[2]
    r = subprocess.run([sys.executable, str(script), str(tmp)], cwd=root, capture_output=True, text=True,
                       timeout=840)  # fmt: skip
    line = next((x for x in r.stdout.splitlines() if x.startswith("CLUSTER-RESULT ")), None)
    assert r.returncode == 0 and line, r.stderr[-3000:]
    return json.loads(line.split(" ", 1)[1])


def _cycles(r: dict) -> list:
    return [(p["label"], {m: v.get("cycles") for m, v in p.get("models", {}).items()}) for p in r["points"]]


def test_dse_and_regress_on_two_nodes_match_one_process(runs):
    d_ray, d_one = runs["dse_ray"], runs["dse_one"]
    assert runs["nodes"] == 2 and d_ray["code"] == d_one["code"] == 0
    assert d_ray["engine"] == "ray" and d_one["engine"] == "local"
    assert len(d_ray["points"]) == 4 and d_ray["errors"] == [] == d_one["errors"]
    assert _cycles(d_ray) == _cycles(d_one) and d_ray["proxy_front"] == d_one["proxy_front"]
    assert all(v["cycles"] > 0 for p in d_ray["points"] for v in p["models"].values())
    r_ray, r_one = runs["regress_ray"], runs["regress_one"]
    assert r_ray["code"] == r_one["code"] == 0
    assert r_ray["programs"] == r_one["programs"] == 20 and r_ray["shards"] == 2
    assert r_ray["failures"] == r_one["failures"] == [] and r_ray["errors"] == []
    assert r_ray["cycles"] == r_one["cycles"] > 0


def test_a_worker_node_lost_mid_run_loses_no_result(runs):
    r = runs["dse_lost"]
    assert 1 <= runs["done_at_kill"] < 8  # the node went while tasks were still to run
    assert r["code"] == 0 and r["errors"] == [] and not r["interrupted"]
    assert sum(len(p["models"]) for p in r["points"]) == 8
    assert all(p["latency_us"] is not None for p in r["points"])
    assert _cycles(r) == _cycles(runs["dse_one"])  # the same figures as the run in one process
