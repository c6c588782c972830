"""Scale-out on a real two-node Ray cluster on localhost (a head and one worker node, started here):
`npu dse` and an `npu regress` shard give the results of the same run in one process, and a worker
node lost mid-run loses no result (its tasks run again on the head)."""

import json
import threading
import time

import pytest

from npu.cli import main

ray = pytest.importorskip("ray", reason="the cluster extra is not installed")
# the regress shards run on the tiny RTL top: built once with the other tiny tests
pytestmark = [pytest.mark.rtl, pytest.mark.xdist_group("rtl-tiny")]

DSE = ["dse", "--models", "digits_mlp,digits_cnn", "--param", "array=1x2x8,2x2x8,1x4x8,4x2x8",
       "--param", "acc_bytes=16K,32K", "--synth", "0", "--json"]  # fmt: skip
REGRESS = ["regress", "--config", "tiny", "--programs", "50", "--shard-size", "25", "--json"]


@pytest.fixture
def cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c, worker
    ray.shutdown()
    c.shutdown()


def _run(capsys, args: list[str]) -> dict:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def _cycles(r: dict) -> list:
    return [(p["label"], {m: v.get("cycles") for m, v in p.get("models", {}).items()}) for p in r["points"]]


def test_dse_and_regress_on_two_nodes_match_one_process(cluster, tmp_path, capsys):
    c, _ = cluster
    on = ["--engine", "ray", "--address", c.address, "--no-cache"]
    one = ["--engine", "local", "--workers", "1", "--no-cache"]
    d_ray = _run(capsys, [*DSE, *on, "--out", str(tmp_path / "a")])
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2  # the run used the two-node cluster
    d_one = _run(capsys, [*DSE, *one, "--out", str(tmp_path / "b")])
    assert d_ray["engine"] == "ray" and d_one["engine"] == "local"
    assert len(d_ray["points"]) == 8 and d_ray["errors"] == []
    assert _cycles(d_ray) == _cycles(d_one) and d_ray["proxy_front"] == d_one["proxy_front"]
    assert all(v["cycles"] > 0 for p in d_ray["points"] for v in p["models"].values())

    r_ray = _run(capsys, [*REGRESS, *on, "--cache", str(tmp_path / "c1")])
    r_one = _run(capsys, [*REGRESS, *one, "--cache", str(tmp_path / "c2")])
    assert r_ray["programs"] == r_one["programs"] == 50 and r_ray["shards"] == 2
    assert r_ray["failures"] == r_one["failures"] == [] and r_ray["errors"] == []
    assert r_ray["cycles"] == r_one["cycles"] > 0


def test_a_worker_node_lost_mid_run_loses_no_result(cluster, tmp_path, capsys):
    c, worker = cluster
    cache = tmp_path / "cache"
    result: dict = {}

    def run():
        result["code"] = main([*DSE, "--engine", "ray", "--address", c.address, "--cache", str(cache),
                               "--out", str(tmp_path / "out")])  # fmt: skip

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 300
    while not list(cache.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    done_at_kill = len(list(cache.glob("*.json")))
    c.remove_node(worker)  # its running tasks die with it
    t.join(timeout=600)
    assert not t.is_alive() and result["code"] == 0
    assert 1 <= done_at_kill < 16  # the node went while tasks were still to run
    r = json.loads(capsys.readouterr().out)
    assert r["errors"] == [] and not r["interrupted"]
    assert all(p["latency_us"] is not None for p in r["points"])
    assert sum(len(p["models"]) for p in r["points"]) == 16
    # the same figures as a run in one process
    one = _run(
        capsys, [*DSE, "--engine", "local", "--workers", "1", "--no-cache", "--out", str(tmp_path / "b")]
    )
    assert _cycles(r) == _cycles(one)
