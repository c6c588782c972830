"""Bank conflicts the matrix unit's operand reads meet in a banked scratchpad, for candidate mappings.

The multi-port scratchpad of `tiny` and `default` has a port per reader (docs/simulation.md). Block
RAM has two ports, so a scratchpad that maps to an FPGA must be banked (the `banked` preset): each
MATMUL step reads `clusters` A lane words and `pes_per_cluster` B^T lane words, and reads that fall
into the same bank take one cycle each. This module measures, on real programs, how many matrix
cycles candidate bank mappings would add, to choose the mapping and see which layouts the compiler
has to change.

Mappings of a lane-word index g (byte address // lanes):
  * modulo: g mod B (B = spad_banks), the plain low-order interleave;
  * skewed: the sum of g's base-B digits, mod B (power-of-B strides land in consecutive banks);
  * prime: g mod P, P the smallest prime >= clusters + pes_per_cluster (no power-of-two stride maps two
    rows of a tile to one bank; P banks of spad_bytes / P each);
  * split-skewed, split-prime: A and B^T reads in separate groups of banks (activations and weights
    in separate regions, so they never meet), rows interleaved within a group as above;
  * regions-prime: what the `banked` preset builds (hdl/spad.py): the group is the address's half of
    the scratchpad, so A and B^T only stay apart if the program keeps weights in the upper half.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from npu.arith import cdiv
from npu.config import NpuConfig
from npu.isa import Instr, Opcode


def _next_prime(n: int) -> int:
    p = max(2, n)
    while any(p % d == 0 for d in range(2, int(p**0.5) + 1)):
        p += 1
    return p


def _skewed(g: np.ndarray, B: int) -> np.ndarray:
    total = np.zeros_like(g)
    rest = g.copy()
    while rest.any():
        total += rest % B
        rest //= B
    return total % B


def mappings(cfg: NpuConfig) -> dict[str, tuple[int, Callable[[np.ndarray], np.ndarray], bool]]:
    """Name -> (bank count, lane-word index -> bank, split). A split mapping keeps A (activation)
    and B^T (weight) reads in separate bank groups of half the banks each (the compiler would place
    weights in their own region), and interleaves rows within a group."""
    B = cfg.spad_banks
    P = _next_prime(cfg.clusters + cfg.pes_per_cluster)
    Ph = _next_prime(max(cfg.clusters, cfg.pes_per_cluster))
    half = cfg.spad_bytes // cfg.lanes // 2
    return {
        "modulo": (B, lambda g: g % B, False),
        "skewed": (B, lambda g: _skewed(g, B), False),
        "prime": (P, lambda g: g % P, False),
        "split-skewed": (B, lambda g: _skewed(g, B // 2), True),
        "split-prime": (2 * Ph, lambda g: g % Ph, True),
        "regions-prime": (2 * Ph, lambda g: (g // half) * Ph + (g % half) % Ph, False),
    }


def matmul_step_cycles(
    ins: Instr,
    cfg: NpuConfig,
    banks: int,
    bank_of: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
    samples: int = 1024,
    split: bool = False,
) -> tuple[int, float]:
    """(steps, expected cycles) of one MATMUL when a step takes as many cycles as the most reads any
    one bank serves (`split`: A and B^T in separate bank groups). Steps are sampled uniformly when
    there are more than `samples`."""
    f = ins.fields
    CM, CN, L = cfg.clusters, cfg.pes_per_cluster, cfg.lanes
    MB, NB, KB = cdiv(f["m"], CM), cdiv(f["n"], CN), max(1, cdiv(f["k"], L))
    steps = MB * NB * KB
    if steps == 0:
        return 0, 0.0
    if steps <= samples:
        idx = np.arange(steps)
    else:
        idx = rng.integers(0, steps, samples)
    mb, rest = np.divmod(idx, NB * KB)
    nb, kb = np.divmod(rest, KB)
    i = np.arange(CM)
    j = np.arange(CN)
    a_rows = mb[:, None] * CM + i  # (S, CM)
    b_rows = nb[:, None] * CN + j
    ga = (f["a"] + a_rows * f["a_stride"]) // L + kb[:, None]
    gb = (f["b"] + b_rows * f["b_stride"]) // L + kb[:, None]
    g = np.concatenate([ga, gb], axis=1)
    valid = np.concatenate([a_rows < f["m"], b_rows < f["n"]], axis=1)
    bank = bank_of(g)
    if split:  # B^T rows in the second group
        bank[:, CM:] += banks // 2
    onehot = (bank[:, :, None] == np.arange(banks)) & valid[:, :, None]
    mult = onehot.sum(axis=1).max(axis=1)
    return steps, float(mult.mean()) * steps


def program_conflicts(instrs: Iterable[Instr], cfg: NpuConfig, seed: int = 0) -> dict:
    """Matrix steps and the cycles each mapping would need for them, over a program's MATMULs."""
    rng = np.random.default_rng(seed)
    maps = mappings(cfg)
    matmuls = [i for i in instrs if i.op == Opcode.MATMUL]
    out: dict = {"matmuls": len(matmuls), "steps": 0, "mappings": {}}
    for name, (banks, fn, split) in maps.items():
        total = 0.0
        steps = 0
        for ins in matmuls:
            s, c = matmul_step_cycles(ins, cfg, banks, fn, rng, split=split)
            steps += s
            total += c
        out["steps"] = steps
        out["mappings"][name] = {
            "banks": banks,
            "cycles": round(total),
            "slowdown": round(total / steps, 4) if steps else 1.0,
        }
    return out
