"""Run by tests/explore/test_cluster.py in a process of its own (Ray's client state must not be
inherited by the test workers' later forks): the one-process reference runs first, then a two-node
Ray cluster on localhost (a head and a worker node), the same runs on it, and a run whose worker
node is removed while its tasks run. Prints one JSON object of every result."""

import contextlib
import io
import json
import sys
import threading
import time
from pathlib import Path

from npu.cli import main

# 4 design points x 2 models and 2 regression shards: enough tasks to spread over two nodes and to
# lose a node with some left (the full sweeps are the commands' own)
DSE = ["dse", "--models", "digits_mlp,digits_cnn", "--param", "array=1x2x8,2x2x8",
       "--param", "acc_bytes=16K,32K", "--synth", "0", "--json"]  # fmt: skip
REGRESS = ["regress", "--config", "tiny", "--programs", "20", "--shard-size", "10", "--json"]


def run(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    return {"code": code, **json.loads(out.getvalue())}


def main_run(tmp: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    one = ["--engine", "local", "--workers", "1", "--no-cache"]
    res = {"dse_one": run([*DSE, *one, "--out", str(tmp / "a")]),
           "regress_one": run([*REGRESS, *one, "--cache", str(tmp / "r1")])}  # fmt: skip
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    try:
        on = ["--engine", "ray", "--address", c.address, "--no-cache"]
        res["dse_ray"] = run([*DSE, *on, "--out", str(tmp / "b")])
        res["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        res["regress_ray"] = run([*REGRESS, *on, "--cache", str(tmp / "r2")])
        # a node lost mid-run: removed once the first result is in the cache
        cache, box = tmp / "cache", {}
        lost = [
            *DSE,
            "--engine",
            "ray",
            "--address",
            c.address,
            "--cache",
            str(cache),
            "--out",
            str(tmp / "c"),
        ]
        t = threading.Thread(target=lambda: box.update(r=run(lost)))
        t.start()
        deadline = time.monotonic() + 300
        while not list(cache.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        res["done_at_kill"] = len(list(cache.glob("*.json")))
        c.remove_node(worker)
        t.join(timeout=600)
        res["dse_lost"] = box.get("r")
    finally:
        ray.shutdown()
        c.shutdown()
    return res


if __name__ == "__main__":
    print("CLUSTER-RESULT " + json.dumps(main_run(Path(sys.argv[1]))))
