"""Fixed sites for the matrix unit's multipliers on an ECP5 board (`npu build --dsp-sites`).

Yosys maps each MAC lane's `*` to a MULT18X18D, and nextpnr's placers spread those over the whole
die when the array takes most of the part's multipliers: on the 85F with 128 MACs a processing
element's eight lanes ended up to 17 columns apart, its A multiplicand register's two DSPs (the
cluster's two PEs) far from each other, and their nets were a quarter of the design's wirelength
(docs/boards.md, "Where `ulx3s128s` congests"). Here each cluster's DSPs take consecutive sites of
one DSP row, lane t of its PEs side by side, so a multiplicand spans two neighbouring sites and a
PE's products one cluster's stretch of the row. The sites are given to nextpnr as each cell's BEL
attribute by a Yosys script run after synthesis; every lane's cell must be found exactly once, or
the build stops with Yosys's assertion (the names come from the matrix unit's `prod{i}_{j}_{t}`
product registers, hdl/matrix.py)."""

from __future__ import annotations

from dataclasses import dataclass

from npu.config import ConfigError, NpuConfig


@dataclass(frozen=True)
class DspGrid:
    """An ECP5 part's MULT18X18D sites: rows (tile Y) in the order the array fills them, and the
    columns (tile X) each row has sites at, left to right."""

    rows: tuple[int, ...]
    columns: tuple[int, ...]

    def site(self, x: int, y: int) -> str:
        """nextpnr's BEL name of the multiplier at column `x` of row `y`: the columns come in pairs,
        the pairs alternate between a slice's MULT18_0/1 and MULT18_4/5."""
        k = self.columns.index(x)
        names = ("MULT18_0", "MULT18_1") if (k // 2) % 2 == 0 else ("MULT18_4", "MULT18_5")
        return f"X{x}/Y{y}/{names[k % 2]}"


#: the LFE5U-85F: three rows of 52 across the die (as nextpnr 0.11 places them); the array fills
#: the two nearer the die's middle first
ECP5_85F = DspGrid(
    rows=(34, 58, 10),
    columns=(4, 5, 8, 9, 13, 14, 17, 18, 22, 23, 26, 27, 31, 32, 35, 36, 40, 41, 44, 45, 49, 50, 53, 54,
             58, 59, 62, 63, 69, 70, 73, 74, 78, 79, 82, 83, 87, 88, 91, 92, 96, 97, 100, 101, 105, 106,
             109, 110, 114, 115, 118, 119),
)  # fmt: skip


def matrix_sites(cfg: NpuConfig, grid: DspGrid) -> dict[tuple[int, int, int], str]:
    """(cluster, PE, lane) -> BEL: cluster by cluster along the rows, each cluster's lanes in order
    with its PEs' lane t side by side. A cluster never straddles two rows."""
    CM, CN, L = cfg.clusters, cfg.pes_per_cluster, cfg.lanes
    per_cluster = CN * L
    per_row = len(grid.columns) // per_cluster
    if per_row == 0 or CM > per_row * len(grid.rows):
        raise ConfigError(
            f"{cfg.name}: {CM} clusters of {per_cluster} multipliers do not fit {len(grid.rows)} DSP rows of "
            f"{len(grid.columns)} sites a cluster to a row"
        )
    out = {}
    for i in range(CM):
        y, first = grid.rows[i // per_row], (i % per_row) * per_cluster
        for t in range(L):
            for j in range(CN):
                out[(i, j, t)] = grid.site(grid.columns[first + t * CN + j], y)
    return out


def lock_script(cfg: NpuConfig, grid: DspGrid) -> str:
    """Yosys commands (after synthesis) giving every matrix lane's MULT18X18D its site, each found
    exactly once (else Yosys stops the build naming the selection)."""
    lines = []
    for (i, j, t), bel in matrix_sites(cfg, grid).items():
        sel = f"t:MULT18X18D c:*.matrix.prod{i}_{j}_{t}_* %i"
        lines += [f"select -assert-count 1 {sel}", f'setattr -set BEL "{bel}" {sel}']
    return "\n".join(lines)


def wants_lock(cfg: NpuConfig, capacity: int) -> bool:
    """The default: fixed sites where the array takes more than half the part's multipliers (there
    the placers scattered it; `ulx3s32`'s 32 keep the placement that meets timing)."""
    return cfg.macs_per_cycle * 2 > capacity
