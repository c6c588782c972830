"""Cycle costs of unit instructions: the rules docs/isa.md ("Timing") states, in one place.

The golden model uses these to schedule its pipeline; the compiler uses them as its cost model.
"""

from __future__ import annotations

import functools

import numpy as np

from npu.config import ACC_BASE, NpuConfig
from npu.isa import LUT_BYTES, Instr, Opcode, elem_bytes, per_config

from .arith import cdiv

#: Channel cycles a write burst takes besides its beats: the memory takes the next burst's address
#: only once this one's response has been taken (hdl/simdram.py), so bursts do not overlap.
WRITE_BURST_CYCLES = 2
#: Instructions the fetcher asks for in one burst (hdl/fetch.py): at most FETCH_BURST, and once its
#: buffer is full it asks again as soon as FETCH_REFILL slots are free
FETCH_BURST = 4
FETCH_REFILL = 2
#: A write burst's cycles besides its words on a DRAM narrower than the bus (the board's SDRAM
#: controller writes each word as it comes, with no read latency to wait for; the address and the
#: response take these): fitted to the STORE probes of `npu bench board` (docs/boards.md)
NARROW_WRITE_BURST_CYCLES = 4
#: A STORE's cycles besides its bursts: issuing the first address, the read word's register
#: before the unit's FIFO (hdl/store.py), taking the last response.
STORE_CYCLES = 3


def dma_beats(addr: int, rows: int, cols: int, stride: int, bus: int) -> int:
    """AXI beats to move `rows` rows of `cols` bytes: each row covers the bus words it touches."""
    if rows == 0 or cols == 0:
        return 0
    if stride % bus == 0:
        return rows * cdiv(addr % bus + cols, bus)
    total = 0
    for r in range(rows):
        total += cdiv((addr + r * stride) % bus + cols, bus)
    return total


def dma_bursts(addr: int, rows: int, cols: int, stride: int, bus: int) -> int:
    """AXI bursts the load and store units split a transfer into: each row's bus words, split at
    256 beats and at 4 KiB boundaries (hdl/load.py, hdl/store.py)."""
    if rows == 0 or cols == 0:
        return 0
    if cdiv(bus - 1 + cols, bus) <= 256 and cols <= 4096:
        # a row is one burst, or two when it crosses a 4 KiB boundary
        if rows <= 32:  # numpy's call overhead is most of a short transfer's cost (cost model)
            n = rows
            for r in range(rows):
                a = (addr + r * stride) % 4096
                n += a - a % bus + cdiv(a % bus + cols, bus) * bus > 4096
            return n
        a = (addr + np.arange(rows, dtype=np.int64) * stride) % 4096
        return rows + int(np.count_nonzero(a - a % bus + cdiv(a % bus + cols, bus) * bus > 4096))
    total = 0
    for r in range(rows):
        a = addr + r * stride
        start, end = a - a % bus, a + cols
        while start < end:
            start += min(cdiv(end - start, bus), 256, (4096 - start % 4096) // bus) * bus
            total += 1
    return total


def spad_bank(g: np.ndarray, cfg: NpuConfig, mem: str = "spad") -> np.ndarray:
    """Bank of word `g` of the scratchpad (lane words) or the accumulators (`mem` "acc": rows of
    bus_bytes) in a banked configuration (hdl/spad.py): two regions (lower and upper half) of
    spad_banks / 2 banks, words interleaved modulo that count."""
    P = cfg.spad_banks // 2
    half = (cfg.spad_bytes // cfg.lanes if mem == "spad" else cfg.acc_bytes // cfg.bus_bytes) // 2
    return (g // half) * P + (g % half) % P


@functools.lru_cache(maxsize=4096)
def _least_shared(P: int, pitches: tuple[int, ...], readers: int, reads: int = 1) -> tuple[int, int]:
    """(index of the first of `pitches` (lane words) at which `readers` rows read in one step (row i
    at word i * pitch + s, `reads` consecutive words each through one port) share the `P` banks of
    a region least; the most reads of one bank there). Cached: the planners ask it in their inner
    loops."""
    rows = np.arange(readers)[:, None]
    best = None
    for j, pitch in enumerate(pitches):
        words = (rows * pitch + np.arange(reads)).reshape(1, -1) % P  # the same at every step, turned
        worst = int(_most_per_bank(words, np.ones(words.shape, bool), P)[0])
        if best is None or worst < best[1]:
            best = (j, worst)
    return best


def bank_stride(cfg: NpuConfig, stride: int, unit: int, word: int | None = None, elem: int = 1) -> int:
    """A row stride of `elem`-byte elements (a multiple of `unit` of them) at which, in a banked
    configuration, the rows a step reads together (the clusters' A rows, the PEs' B^T rows) fall
    into the most different banks of a region (`word`-byte words, lanes by default): `stride` plus
    the fewest `unit`s that do. Unchanged without banking, or where no added unit helps (an int16
    map's channel unit on two banks is an even number of words: see `a_pitch`)."""
    word = word or cfg.lanes
    if not cfg.spad_banked or not stride:
        return stride
    P = cfg.spad_banks // 2
    readers = max(2, cfg.a_readers, cfg.pes_per_cluster)
    steps = tuple((stride + j * unit) * elem // word for j in range(P))
    return stride + unit * _least_shared(P, steps, readers)[0]


def _a_reads(cfg: NpuConfig, elems: int, ex: int) -> tuple[int, int, int] | None:
    """(banks a region has, lane words of a pixel of `elems` elements of `ex` bytes, A words a
    cluster reads a step through port A: two with `a16_full_rate` and int16, but one where the
    second comes through port B, `a16_second_port`) where the clusters' A reads can share a bank
    (banked, several clusters, whole words a pixel); None where they cannot."""
    if not cfg.spad_banked or cfg.clusters == 1 or cfg.a_stage_bytes or (elems * ex) % cfg.lanes:
        return None  # (staged A: a step reads no A word of the scratchpad)
    two = cfg.a16_full_rate and ex == 2 and not cfg.a16_second_port
    return cfg.spad_banks // 2, elems * ex // cfg.lanes, 2 if two else 1


def a_pitch(cfg: NpuConfig, elems: int, ex: int, stride: int = 1) -> int:
    """Elements of an input pixel on chip (`elems` of them hold data, `ex` bytes each) for MATMULs
    whose A rows are pixels `stride` apart: `elems`, or on a banked scratchpad with several clusters
    that plus the fewest lane words that put the clusters' A reads of a step into the most
    different banks (cluster i reads row i of a tile, word i * pitch + s at k step s; two words
    with `a16_full_rate` and int16, the second through port B with `a16_second_port`). An int16
    map's channel unit is two lane words, so on two banks its pitch in DRAM cannot be moved off
    their period (`bank_stride`): on chip it can."""
    if (a := _a_reads(cfg, elems, ex)) is None:
        return elems
    P, base, reads = a
    pitches = tuple(stride * (base + j) for j in range(P))
    return elems + _least_shared(P, pitches, cfg.clusters, reads)[0] * cfg.lanes // ex


def a_sharing(cfg: NpuConfig, elems: int, ex: int, stride: int = 1) -> int:
    """The most A reads one bank serves in a step of MATMULs whose rows are pixels `stride` apart at a
    pitch of `elems` elements of `ex` bytes (the cycles each step takes for them): 1 without banking
    or with one cluster."""
    if (a := _a_reads(cfg, elems, ex)) is None:
        return 1
    P, base, reads = a
    return _least_shared(P, (stride * base,), cfg.clusters, reads)[1]


def a_planes(cfg: NpuConfig, elems: int, ex: int, stride: int) -> int:
    """1, or `stride` where the clusters' A rows of pixels `stride` apart share a bank at every pitch
    (`a_pitch`: on two banks a half, any pitch times 2 is even) and adjacent ones need not: a
    strided convolution's band then keeps each row's columns by their remainder mod `stride`, a
    plane each, so the pixels a MATMUL reads are adjacent (compiler/spatial.py)."""
    if stride == 1 or (a := _a_reads(cfg, elems, ex)) is None:
        return 1
    P, base, reads = a

    def worst(s: int) -> int:
        return _least_shared(P, tuple(s * (base + j) for j in range(P)), cfg.clusters, reads)[1]

    return stride if worst(stride) > worst(1) else 1


def _most_per_bank(banks: np.ndarray, valid: np.ndarray, nbanks: int) -> np.ndarray:
    """Per row of `banks` (..., readers): the largest number of valid readers sharing one bank."""
    onehot = (banks[..., None] == np.arange(nbanks)) & valid[..., None]
    return onehot.sum(axis=-2).max(axis=-1)


def c_row_cycles(words: np.ndarray, valid: np.ndarray, cfg: NpuConfig) -> np.ndarray:
    """Cycles the C rows of a tile take to read or write, per row of `words` (..., clusters; the
    accumulator words of the valid rows): the most rows in one accumulator bank, and with
    `c_clients` the most rows on one client (cluster i's on client i mod c_clients)."""
    most = _most_per_bank(spad_bank(words, cfg, "acc"), valid, cfg.spad_banks)
    n = cfg.c_clients
    if n:
        on = [valid[..., q::n].sum(axis=-1) for q in range(n)]
        most = np.maximum(most, np.max(on, axis=0))
    return most


def a_step_bytes(cfg: NpuConfig, a_bytes: int) -> int:
    """Bytes an A element of `a_bytes` (1 int8, 2 int16) takes of a matrix step's `lanes`: 1 where the
    lanes multiply int16 A (`a16_full_rate`: two A words a step), else its size."""
    return 1 if cfg.a16_full_rate else a_bytes


def matmul_k_steps(f: dict, cfg: NpuConfig) -> int:
    """k steps of one MATMUL tile: `lanes` elements a step, `lanes / 2` with int16 A (a step reads
    one A word of `lanes` bytes either way) unless the lanes take int16 (`a16_full_rate`)."""
    return max(1, cdiv(a_step_bytes(cfg, elem_bytes(f, "a")) * f["k"], cfg.lanes))


def banked_matmul_steps(f: dict, cfg: NpuConfig) -> int:
    """Cycles of a MATMUL's steps on banked memories: each step takes as many cycles as the most
    operand reads one port of a scratchpad bank serves (rows past m or n are not read). A step
    reads A word a0 + s and B word b0 + s (b0 + s // 2 with int16 A; with `a16_full_rate` A words
    a0 + 2s and a0 + 2s + 1, the second through port B with `a16_second_port`, and B word b0 + s),
    so the banks' pattern repeats with the banks per region: it is counted at k steps 0 .. 2P - 1
    (KB - 1 at most) and weighted. At a tile's last k step the C rows are read (when accumulating) and
    written, one per accumulator bank a cycle, while the next tile's steps are read."""
    CM, CN, L = cfg.clusters, cfg.pes_per_cluster, cfg.lanes
    MB, NB, KB = cdiv(f["m"], CM), cdiv(f["n"], CN), matmul_k_steps(f, cfg)
    nbanks = cfg.spad_banks
    P = nbanks // 2
    ra = np.arange(MB)[:, None] * CM + np.arange(CM)
    rb = np.arange(NB)[:, None] * CN + np.arange(CN)
    wide = elem_bytes(f, "a") == 2
    full = wide and cfg.a16_full_rate  # two A words a step, B word s
    steps = range(min(KB, 2 * P)) if wide else range(1)

    def per_bank(words: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Reads of each tile row group in each bank: (tiles, banks)."""
        hits = (spad_bank(words, cfg)[..., None] == np.arange(nbanks)) & valid[..., None]
        return hits.sum(axis=1).astype(np.int32)

    wa, wb = (f["a"] + ra * f["a_stride"]) // L, (f["b"] + rb * f["b_stride"]) // L
    second = full and cfg.a16_second_port  # the second A words on port B
    ca = [per_bank(wa + (2 * s if full else s), ra < f["m"]) for s in steps]
    hi = [per_bank(wa + 2 * s + 1, ra < f["m"]) for s in steps] if full else None
    if full and not second:  # both on port A
        ca = [a + h for a, h in zip(ca, hi, strict=True)]
    cb = [per_bank(wb + (s // 2 if wide and not full else s), rb < f["n"]) for s in steps]
    # port B's second A words (its writers are not counted, as no other unit's accesses are): (mb,)
    # cycles a step
    ch = [h.max(axis=1) for h in hi] if second else None
    # how many of the KB steps share each counted step's pattern (period 2P with int16 A)
    weight = [len(range(s, KB, 2 * P)) for s in steps] if wide else [KB]
    # C rows (accumulators): written at the last k step, each bank taking one a cycle (stage 1 holds
    # for the rest); read at that step too when accumulating
    W = cfg.bus_bytes
    rc = (f["c"] - ACC_BASE) // W + ra * (f["c_stride"] // W)  # (MB, CM) word of each C row at nb = 0
    total = 0
    last_s = steps.index((KB - 1) % (2 * P)) if wide else 0  # the pattern of the last k step
    for m0 in range(0, MB, 256):  # bounded memory for very tall MATMULs
        pats = [
            (a[m0 : m0 + 256, None, :] + b[None, :, :]).max(axis=2) for a, b in zip(ca, cb, strict=True)
        ]  # (mb, nb)
        if second:
            pats = [np.maximum(p, h[m0 : m0 + 256, None]) for p, h in zip(pats, ch, strict=True)]
        words = rc[m0 : m0 + 256, None, :] + np.arange(NB)[None, :, None]  # (mb, nb, CM)
        valid = np.broadcast_to((ra[m0 : m0 + 256] < f["m"])[:, None, :], words.shape)
        cmult = c_row_cycles(words, valid, cfg)
        step = pats[last_s]
        last = np.maximum(step, cmult) if f["accumulate"] else step
        # a tile's issue (stage 0: its steps' reads) and its drain (stage 1: a cycle a step, and
        # the last step's C writes) overlap: the slower of the two sets the tile's cycles
        issue = sum(p * w for p, w in zip(pats, weight, strict=True)) - step + last
        total += int(np.maximum(issue, KB - 1 + np.maximum(cmult, 1)).sum())
    return total


#: cycles a staged fill costs besides its pairs (`a_stage_bytes`: its start, its last write)
STAGE_FILL_CYCLES = 2


def staged_matmul_steps(f: dict, cfg: NpuConfig) -> int:
    """Cycles of a MATMUL's steps with A staged in the matrix unit (`a_stage_bytes`). A job, an m
    tile's chunk of k steps (a row longer than a buffer runs in chunks), is staged into one of two
    buffers, a pair of lane words of each row a cycle, while the steps of the job before run from
    the other: a fill starts once the previous one has ended and the steps of the job two before
    have freed its buffer, and a job's steps start a cycle after the previous job's (the setup)
    once its fill has ended. Each n tile's k steps take as many cycles as the most B^T words one
    scratchpad bank serves (A comes from the buffers), and its C rows are written at its last step,
    one per accumulator bank a cycle (and read there too when accumulating, or for every chunk after
    a row's first), overlapping the next tile's steps as `banked_matmul_steps` counts them; a tile of
    three steps or more that reads its C rows waits for the previous tile's writes."""
    CM, CN, L = cfg.clusters, cfg.pes_per_cluster, cfg.lanes
    MB, NB, KB = cdiv(f["m"], CM), cdiv(f["n"], CN), matmul_k_steps(f, cfg)
    wide = elem_bytes(f, "a") == 2
    pairstep = wide and cfg.a16_full_rate
    D = cfg.a_stage_bytes // (2 * L)
    KC = D if pairstep else 2 * D
    rb = np.arange(NB)[:, None] * CN + np.arange(CN)
    wb = (f["b"] + rb * f["b_stride"]) // L
    P, nb = (cfg.spad_banks // 2, cfg.spad_banks) if cfg.spad_banked else (1, 1)
    period = 2 * P
    if cfg.spad_banked:  # (period, NB): the cycles of step s (mod the period) of each n tile
        per = np.stack(
            [
                _most_per_bank(spad_bank(wb + (s // 2 if wide and not pairstep else s), cfg), rb < f["n"], nb)
                for s in range(period)
            ]
        )
    else:
        per = np.ones((period, NB), dtype=np.int64)
    W = cfg.bus_bytes
    ra = np.arange(MB)[:, None] * CM + np.arange(CM)
    rows = (ra < f["m"]).sum(axis=1)  # (MB,) the rows each m tile stages
    rc = (f["c"] - ACC_BASE) // W + ra * (f["c_stride"] // W)
    # each chunk of k steps: its steps, pairs staged a row, summed B cycles (NB,), last step's (NB,)
    chunks = []
    for k0 in range(0, KB, KC):
        steps = min(KC, KB - k0)
        count = np.bincount(np.arange(k0, k0 + steps) % period, minlength=period)
        last = per[(k0 + steps - 1) % period]
        chunks.append((steps, steps if pairstep else cdiv(steps, 2), (count[:, None] * per).sum(axis=0), last,
                       f["accumulate"] or k0 > 0))  # fmt: skip
    fill = rows[:, None] * np.array([pairs for _, pairs, _, _, _ in chunks])[None, :] + STAGE_FILL_CYCLES
    comp = np.zeros((MB, len(chunks)), dtype=np.int64)  # the steps' cycles of each job
    for m0 in range(0, MB, 256):  # bounded memory for very tall MATMULs
        words = rc[m0 : m0 + 256, None, :] + np.arange(NB)[None, :, None]
        valid = np.broadcast_to((ra[m0 : m0 + 256] < f["m"])[:, None, :], words.shape)
        if cfg.spad_banked:
            cmult = c_row_cycles(words, valid, cfg)
        else:
            cmult = np.ones(words.shape[:2], dtype=np.int64)
        for c, (steps, _, issue, last, adds) in enumerate(chunks):
            end = np.maximum(last[None, :], cmult) if adds else last[None, :]  # the C reads, when adding
            tile = np.maximum(issue[None, :] - last[None, :] + end, steps - 1 + np.maximum(cmult, 1))
            if adds and steps >= 3:
                # the last step's C reads wait for the previous tile's C writes: while stage 1 writes,
                # only two of the tile's steps wait in the stages before it (measured on the RTL)
                tile = np.maximum(tile, end + cmult + steps - 3)
            comp[m0 : m0 + 256, c] = tile.sum(axis=1)
    return _double_buffered(fill.ravel().tolist(), comp.ravel().tolist())


def _double_buffered(fill: list[int], comp: list[int]) -> int:
    """Cycles of jobs whose fills (`fill` cycles each) run into two buffers ahead of their steps
    (`comp` cycles each, a cycle of setup between two jobs), in job order."""
    ready = fill[0]  # the cycle the job's buffer is ready
    end = ready + comp[0]  # the cycle its steps end
    ends = [end]
    for j in range(1, len(fill)):
        freed = ends[j - 2] + 1 if j >= 2 else 0  # the job two before freed this buffer
        ready = max(ready, freed) + fill[j]
        end = max(end + 1, ready) + comp[j]
        ends.append(end)
    return end


def banked_vector_steps(
    a: int, b: int, rows: int, cols: int, a_stride: int, b_stride: int, cfg: NpuConfig,
    es: tuple[int, int] = (1, 1),
) -> int:  # fmt: skip
    """Cycles of the steps of a two-operand vector instruction (VADD: one row; VMUL) on a banked
    scratchpad: a step reads one or two lane words of each operand and takes as many cycles as the
    most of them one bank serves. `es`: the operands' element bytes."""
    VL, L = cfg.vector_lanes, cfg.lanes
    per_row = cdiv(cols, VL)
    off = np.tile(np.arange(per_row) * VL, rows)
    row = np.repeat(np.arange(rows), per_row)
    n = np.minimum(VL, cols - off)
    words, valid = [], []
    for base, stride, e in ((a, a_stride, es[0]), (b, b_stride, es[1])):
        addr = base + row * stride + off * e
        g = addr // L
        words += [g, g + 1]
        valid += [np.ones(len(off), bool), addr % L + n * e > L]
    return int(_most_per_bank(spad_bank(np.stack(words, 1), cfg), np.stack(valid, 1), cfg.spad_banks).sum())


def dram_cycles(cfg: NpuConfig, beats: int, bursts: int, write: bool = False) -> int:
    """Cycles the DRAM takes for `beats` bus words in `bursts` bursts: a word a cycle, or, with a
    DRAM narrower than the bus, its words and each burst's own cost (npu.config: dram_word_bytes;
    a write burst's is `NARROW_WRITE_BURST_CYCLES`)."""
    if not cfg.dram_word_bytes:
        return beats
    per_burst = NARROW_WRITE_BURST_CYCLES if write else cfg.dram_burst_cycles
    return beats * (cfg.bus_bytes // cfg.dram_word_bytes) + bursts * per_burst


def dram_floor_cycles(cfg: NpuConfig, read_bytes: int, write_bytes: int) -> int:
    """The fewest cycles in which the DRAM can move `read_bytes` and `write_bytes` (instruction
    fetch counts as reads): a shared narrow DRAM moves `dram_word_bytes` a cycle in either direction;
    a wide one a bus word a cycle on each of its read and write channels. Bursts and latency only
    add to it, so it is a lower bound on any program moving those bytes (the roofline's memory side)."""
    if cfg.dram_word_bytes:
        return cdiv(read_bytes + write_bytes, cfg.dram_word_bytes)
    return max(cdiv(read_bytes, cfg.bus_bytes), cdiv(write_bytes, cfg.bus_bytes))


def duration(i: Instr, cfg: NpuConfig) -> int:
    """Cycles a unit is busy with one instruction (>= 1)."""
    return per_config(i, "_durations", cfg, _duration)  # asked many times by the compiler


def _duration(i: Instr, cfg: NpuConfig) -> int:
    if cfg.core == "micro":  # the firmware's costs (one instruction at a time)
        return micro_duration(i)
    f = i.fields
    op = i.op
    if op == Opcode.LOAD:
        args = (f["dram"], f["rows"], f["cols"], f["dram_stride"], cfg.bus_bytes)
        beats = dma_beats(*args)
        tr = f["pad_top"] + f["rows"] + f["pad_bottom"]
        tw = f["pad_left"] + f["cols"] + f["pad_right"]
        pad_bytes = tr * tw - f["rows"] * f["cols"]
        data = 0
        if beats:
            data = cfg.dma_latency + dram_cycles(cfg, beats, dma_bursts(*args) if cfg.dram_word_bytes else 0)
        return max(1, data + cdiv(pad_bytes, cfg.bus_bytes))
    if op == Opcode.STORE:
        args = (f["dram"], f["rows"], f["cols"], f["dram_stride"], cfg.bus_bytes)
        beats = dma_beats(*args)
        bursts = dma_bursts(*args) if beats else 0
        if not beats:
            return 1
        if cfg.dram_word_bytes:
            return STORE_CYCLES + dram_cycles(cfg, beats, bursts, write=True)
        return STORE_CYCLES + dram_cycles(cfg, beats, bursts) + WRITE_BURST_CYCLES * bursts
    if op == Opcode.MATMUL:
        if cfg.a_stage_bytes and f["m"] and f["n"]:
            return cfg.matrix_latency + max(1, staged_matmul_steps(f, cfg))
        if cfg.spad_banked and f["m"] and f["n"]:
            return cfg.matrix_latency + max(1, banked_matmul_steps(f, cfg))
        steps = (
            cdiv(f["m"], cfg.clusters)
            * cdiv(f["n"], cfg.pes_per_cluster)
            * cdiv(a_step_bytes(cfg, elem_bytes(f, "a")) * f["k"], cfg.lanes)
        )
        return cfg.matrix_latency + max(1, steps)
    if op == Opcode.VMAP:
        # a vector step takes vector_lanes elements, int8 or int16 alike (docs/isa.md, Timing)
        steps = f["rows"] * cdiv(f["cols"], cfg.vector_lanes)
        if f["per_col"] and steps:  # the multipliers' and shifts' steps come first
            steps += cdiv(4 * f["cols"], cfg.vector_lanes) + cdiv(f["cols"], cfg.vector_lanes)
        return cfg.vector_latency + max(1, steps)
    if op == Opcode.VLUT:  # the table's steps, then the elements'
        steps = f["rows"] * cdiv(f["cols"], cfg.vector_lanes)
        return cfg.vector_latency + (LUT_BYTES // cfg.vector_lanes + steps if steps else 1)  # as VMAP
    if op in (Opcode.VMUL, Opcode.VADD):
        es = (elem_bytes(f, "a"), elem_bytes(f, "b"))
        if op == Opcode.VMUL:
            rc = (f["rows"], f["cols"], f["a_stride"], f["b_stride"])
        else:
            rc = (1, f["len"], 0, 0)
        if cfg.spad_banked and rc[0] and rc[1]:
            return cfg.vector_latency + banked_vector_steps(f["a"], f["b"], *rc, cfg, es)
        return cfg.vector_latency + max(1, rc[0] * cdiv(rc[1], cfg.vector_lanes))
    if op == Opcode.POOL:
        steps = f["out_h"] * f["out_w"] * f["kh"] * f["kw"] * cdiv(f["channels"], cfg.vector_lanes)
        return cfg.vector_latency + max(1, steps)
    if op == Opcode.SYNC:
        return 1
    return 0


def dma_bytes(i: Instr) -> tuple[int, int]:
    """(bytes read from DRAM, bytes written to DRAM) by an instruction."""
    if i.op == Opcode.LOAD:
        return i.rows * i.cols, 0
    if i.op == Opcode.STORE:
        return 0, i.rows * i.cols
    return 0, 0


def ideal_matmul_cycles(m: int, n: int, k: int, cfg: NpuConfig) -> float:
    return m * n * k / cfg.macs_per_cycle


# -- the micro core (hdl/micro/: the ISA run from firmware, one instruction at a time) ---------------
#: features of an instruction the firmware's cost is linear in (hdl/micro/firmware/kernels.c's loops)
MICRO_FEATURES: dict[Opcode, tuple[str, ...]] = {
    Opcode.LOAD: ("base", "rows", "words", "bytes", "pad_bytes"),
    Opcode.STORE: ("base", "rows", "words", "words_unaligned", "bytes"),
    Opcode.MATMUL: (
        "base",
        "blocks",
        "stages",
        "stage_words",
        "stage_words_i16",
        "runs",
        "runs_i16",
        "runs_narrow",
        "run_words",
        "run_words_i16",
        "outputs",
        "zeroed",
    ),
    Opcode.VMAP: ("base", "rows_i32", "elems_i32", "elems", "per_col"),
    Opcode.VLUT: ("base", "elems"),
    Opcode.VMUL: ("base", "elems"),
    Opcode.VADD: ("base", "elems"),
    Opcode.POOL: ("base", "outputs", "window"),
}

#: cycles per feature, measured on the RTL by `npu bench board --board icebreaker` (its probe
#: programs) and fitted by `python -m npu.sim.rtl.probes` (docs/micro.md); an instruction's fetch
#: and checks are in `base`; SYNC costs MICRO_OTHER, a cancellation point or fence that and
#: MICRO_MARKER (its markers run in each of the four unit queues), a run MICRO_RUN besides its
#: instructions (starting, END)
MICRO_COSTS: dict[Opcode, dict[str, float]] = {
    Opcode.LOAD: {"base": 5794.29, "rows": 323.92, "words": 32.0, "bytes": 49.6, "pad_bytes": 8.3},
    Opcode.STORE: {"base": 4716.67, "rows": 65.95, "words": 43.0, "words_unaligned": 90.0, "bytes": 0.0},
    Opcode.MATMUL: {
        "base": 5920.04,
        "blocks": 103.8,
        "stages": 103.29,
        "stage_words": 1.02,
        "stage_words_i16": 0.0,
        "runs": 0.0,
        "runs_i16": 235.5,
        "runs_narrow": 81.48,
        "run_words": 1.0,
        "run_words_i16": 3.25,
        "outputs": 24.25,
        "zeroed": 0.0,
    },
    Opcode.VMAP: {"base": 6704.25, "rows_i32": 290.61, "elems_i32": 160.29, "elems": 308.57, "per_col": 0.0},
    Opcode.VLUT: {"base": 10876.9, "elems": 32.64},
    Opcode.VMUL: {"base": 7699.7, "elems": 433.04},
    Opcode.VADD: {"base": 6649.97, "elems": 385.0},
    Opcode.POOL: {"base": 9294.05, "outputs": 244.83, "window": 93.1},
}
MICRO_OTHER = 2_838
MICRO_MARKER = 2_708
MICRO_RUN = 1_575


def micro_features(i: Instr) -> dict[str, int]:
    """The firmware's loop counts for `i` (MICRO_FEATURES)."""
    f, op = i.fields, i.op
    if op == Opcode.LOAD:
        tr = f["pad_top"] + f["rows"] + f["pad_bottom"]
        tw = f["pad_left"] + f["cols"] + f["pad_right"]
        rows, cols = f["rows"], f["cols"]
        aligned = (f["dram"] ^ (f["spad"] + f["pad_left"])) & 3 == 0 and f["dram_stride"] % 4 == 0
        words = rows * (cols // 4) if aligned else 0
        return {"base": 1, "rows": tr, "words": words, "bytes": rows * cols - 4 * words,
                "pad_bytes": tr * tw - rows * cols}  # fmt: skip
    if op == Opcode.STORE:
        # whole words where the DRAM side is aligned: read as a word, or byte by byte when the
        # scratchpad side is not aligned with it
        dram_ok = f["dram"] % 4 == 0 and f["dram_stride"] % 4 == 0
        words = f["rows"] * (f["cols"] // 4) if dram_ok else 0
        spad_ok = f["spad"] % 4 == 0 and f["spad_stride"] % 4 == 0
        slow = 0 if spad_ok else words
        return {"base": 1, "rows": f["rows"], "words": words - slow, "words_unaligned": slow,
                "bytes": f["rows"] * f["cols"] - 4 * words}  # fmt: skip
    if op == Opcode.MATMUL:
        return _micro_matmul(f)
    if op == Opcode.VMAP:
        n = f["rows"] * f["cols"]
        i32 = f["src_type"] == 1
        return {
            "base": 1,
            "rows_i32": f["rows"] if i32 and not f["per_col"] else 0,  # a call of the row loop each
            "elems_i32": n if i32 else 0,
            "elems": 0 if i32 else n,
            "per_col": f["cols"] * f["per_col"],
        }
    if op in (Opcode.VLUT, Opcode.VMUL):
        return {"base": 1, "elems": f["rows"] * f["cols"]}
    if op == Opcode.VADD:
        return {"base": 1, "elems": f["len"]}
    if op == Opcode.POOL:
        outputs = f["out_h"] * f["out_w"] * f["channels"]
        return {"base": 1, "outputs": outputs, "window": outputs * f["kh"] * f["kw"]}
    return {}


def _micro_matmul(f: dict[str, int]) -> dict[str, int]:
    """MATMUL on the micro core (kernels.c): the MAC array (hdl/micro/mac.py) takes it in `blocks` of
    four output columns and a chunk of k (at most MAC_MAX_WORDS staged entries): each block stages
    its B rows (`stages`, a cycle a word, two for int16 A: `stage_words`) and runs every A row
    against them (`runs`, a cycle an A word: `run_words`; int16 A takes two runs over its words;
    a block of fewer than four columns takes the firmware's loop, not its unrolled path:
    `runs_narrow`), updating C a column at a time (`outputs`). k = 0 zeroes C (`zeroed`) unless it
    accumulates."""
    from npu.config import MICRO_MAC_COLUMNS, MICRO_MAC_MAX_WORDS

    m, n, k, i16 = f["m"], f["n"], f["k"], f["a_i16"]
    chunk = (2 if i16 else 4) * MICRO_MAC_MAX_WORDS
    nk, nj = -(-k // chunk), -(-n // MICRO_MAC_COLUMNS)
    staged, streamed = n * -(-k // 4), m * nj * -(-k // (2 if i16 else 4))
    return {
        "base": 1,
        "blocks": nj * nk,
        "stages": n * nk,
        "stage_words": 0 if i16 else staged,
        "stage_words_i16": staged if i16 else 0,
        "runs": 0 if i16 else m * nj * nk,
        "runs_i16": m * nj * nk if i16 else 0,
        "runs_narrow": 0 if i16 or n % MICRO_MAC_COLUMNS == 0 else m * nk,
        "run_words": 0 if i16 else streamed,
        "run_words_i16": streamed if i16 else 0,
        "outputs": m * n * nk,
        "zeroed": m * n if k == 0 and not f["accumulate"] else 0,
    }


def micro_duration(i: Instr) -> int:
    """Cycles the micro core's firmware takes for `i`, its fetch and checks included."""
    costs = MICRO_COSTS.get(i.op)
    if costs is None:
        return MICRO_OTHER + (MICRO_MARKER if i.op in (Opcode.CANCEL_POINT, Opcode.FENCE) else 0)
    return max(1, round(sum(costs[k] * v for k, v in micro_features(i).items())))
