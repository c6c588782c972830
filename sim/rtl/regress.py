"""The random-program regression in shards: each shard runs a list of seeds' random programs on the
RTL (the in-simulator RAM, stalling every AXI channel at random, as the long sweep does) and on the
golden model, and reports the seeds that disagree. A shard is a pure function of its inputs (the
configuration, the seeds, the pause mode and the sources' digest), so its result is cached on disk
by their digest: a re-run, or an interrupted one, only runs what is missing. `npu regress` spreads
the shards over workers (Ray, or local processes)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from npu.config import get_config
from npu.files import tree_digest

#: seeds of `npu regress` start here by default, away from the test suite's (0.., 1000.., 10000..)
FIRST_SEED = 1_000_000


@dataclass(frozen=True)
class Shard:
    config: str
    seeds: tuple[int, ...]
    pause: str  # "none" or "every" (a cancellation point taken at every one)

    def key(self, digest: str) -> str:
        text = json.dumps([self.config, list(self.seeds), self.pause, digest])
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def plan(config: str, programs: int, first: int = FIRST_SEED, shard_size: int = 25) -> list[Shard]:
    """`programs` seeds from `first`, in shards; every fourth shard pauses at every point."""
    seeds = list(range(first, first + programs))
    chunks = [tuple(seeds[i : i + shard_size]) for i in range(0, len(seeds), shard_size)]
    return [Shard(config, c, "every" if k % 4 == 3 else "none") for k, c in enumerate(chunks)]


def sources_digest() -> str:
    """What a shard's result depends on besides its inputs: the RTL, the golden model, the contracts
    and the harness (their sources)."""
    import npu.config
    import npu.hdl
    import npu.sim.golden

    contracts = Path(npu.config.__file__).parent.glob("*.py")
    packages = [Path(m.__file__).parent for m in (npu.hdl, npu.sim.golden)] + [Path(__file__).parent]
    return tree_digest([*sorted(contracts), *packages])


def run_shard(shard: Shard) -> dict:
    """Run the shard's programs on the RTL and the model: programs, failing seeds (with the first
    difference of each), cycles and wall time."""
    from .core import compare, run_model, run_rtl
    from .suite import random_jobs

    cfg = get_config(shard.config)
    t0 = time.perf_counter()
    cp_prob = 0.3 if shard.pause == "every" else 0.15
    jobs = random_jobs(cfg, shard.seeds, pause=shard.pause, cp_prob=cp_prob)
    rtl = run_rtl(cfg, jobs, fast_dram=True, stalls=True)
    failures, cycles = [], 0
    for seed, job, r in zip(shard.seeds, jobs, rtl, strict=True):
        diffs = compare(run_model(cfg, job), r)
        cycles += r.counters.get("CYCLES", 0)
        if diffs:
            failures.append({"seed": seed, "pause": shard.pause, "differs": diffs[0]})
    return {"programs": len(jobs), "failures": failures, "cycles": cycles,
            "wall_s": round(time.perf_counter() - t0, 3)}  # fmt: skip
