/* Decode checks and validation: npu.isa.decode and npu.isa.validate, rule for rule, in their
   order, so an instruction fails with the same error code as on the golden model. */
#include "fw.h"

/* a field's bits by its width - 1: a table, since the processor shifts 4 bits a cycle */
static const uint32_t MASK[32] = {0x1, 0x3, 0x7, 0xf, 0x1f, 0x3f, 0x7f, 0xff, 0x1ff, 0x3ff, 0x7ff, 0xfff, 0x1fff, 0x3fff, 0x7fff, 0xffff, 0x1ffff, 0x3ffff, 0x7ffff, 0xfffff, 0x1fffff, 0x3fffff, 0x7fffff, 0xffffff, 0x1ffffff, 0x3ffffff, 0x7ffffff, 0xfffffff, 0x1fffffff, 0x3fffffff, 0x7fffffff, 0xffffffff};

/* (run once an instruction, at its check: a queue entry keeps the fields; the fields are cut
   inline, since a call a field doubled the cost of an instruction's fetch and checks) */
void decode(instr_t *ins) {
    int op = OPC(ins);
    const unsigned short *e = &FIELDS[FIELD_START[op]], *end = &FIELDS[FIELD_START[op + 1]];
    int32_t *out = ins->f;
    for (; e < end; e++, out++) {
        unsigned f = *e, pos = f & 255, s = pos & 31, wm1 = (f >> 8) & 31; /* width - 1 */
        const uint32_t *w = &ins->raw.w[pos >> 5];
        uint32_t v = w[0] >> s, mask = MASK[wm1];
        if (s + wm1 >= 32) v |= w[1] << (32 - s); /* the field runs into the next word */
        v &= mask;
        if (f & (1u << 13)) { /* signed: extend its top bit */
            uint32_t sign = (mask >> 1) + 1;
            v = (v ^ sign) - sign;
        }
        *out = (int32_t)v;
    }
}

int unit_of(const instr_t *ins) {
    int op = OPC(ins);
    return op == OP_SYNC ? (int)U(F_SYNC_UNIT) : FORMAT_UNIT[op];
}

/* address arithmetic saturates at 2^32 - 1: a range that reaches it lies outside every memory */
static uint32_t sadd(uint32_t a, uint32_t b) {
    uint32_t r;
    return __builtin_add_overflow(a, b, &r) ? ~0u : r;
}

static uint32_t smul(uint32_t a, uint32_t b) {
    uint32_t r;
    return __builtin_mul_overflow(a, b, &r) ? ~0u : r;
}

/* a byte range [start, end) of on-chip memory: 1 scratchpad, 2 accumulators, 0 neither */
static __attribute__((noinline)) int memory_of(uint32_t start, uint32_t end) {
    if (end <= spad_bytes) return 1;
    if (start >= ACC_BASE && end <= ACC_BASE + acc_bytes) return 2;
    return 0;
}

typedef struct { uint32_t start, end; } span_t;

/* extent(base, rows, width, stride): the bounding range of rows x width bytes */
static __attribute__((noinline)) span_t extent(uint32_t base, uint32_t rows, uint32_t width, uint32_t stride) {
    span_t s = {base, base};
    if (rows && width) s.end = sadd(sadd(base, smul(rows - 1, stride)), width);
    return s;
}

static __attribute__((noinline)) span_t range(uint32_t base, uint32_t n) {
    span_t s = {base, sadd(base, n)};
    return s;
}

static int empty(span_t s) { return s.end <= s.start; }

/* element bytes of an operand with an int16 flag */
#define EB(flag) ((flag) ? 2u : 1u)

/* the footprint (npu.isa.footprint): reads then writes, with the memory each must lie in
   (0: any on-chip memory, 1 scratchpad, 2 accumulators, 3 DRAM) */
typedef struct { span_t s; int mem; int required; } use_t;

static int footprint(const instr_t *ins, use_t *r, int *nr, use_t *w, int *nw) {
    int op = OPC(ins);
    *nr = *nw = 0;
#define R(sp, m) (r[(*nr)++] = (use_t){(sp), (m), 0})
#define W(sp, m) (w[(*nw)++] = (use_t){(sp), (m), 0})
    if (op == OP_LOAD) {
        uint32_t tr = U(F_LOAD_PAD_TOP) + U(F_LOAD_ROWS) + U(F_LOAD_PAD_BOTTOM);
        uint32_t tw = U(F_LOAD_PAD_LEFT) + U(F_LOAD_COLS) + U(F_LOAD_PAD_RIGHT);
        W(extent(U(F_LOAD_SPAD), tr, tw, U(F_LOAD_SPAD_STRIDE)), 0);
        R(extent(U(F_LOAD_DRAM), U(F_LOAD_ROWS), U(F_LOAD_COLS), U(F_LOAD_DRAM_STRIDE)), 3);
    } else if (op == OP_STORE) {
        R(extent(U(F_STORE_SPAD), U(F_STORE_ROWS), U(F_STORE_COLS), U(F_STORE_SPAD_STRIDE)), 0);
        W(extent(U(F_STORE_DRAM), U(F_STORE_ROWS), U(F_STORE_COLS), U(F_STORE_DRAM_STRIDE)), 3);
    } else if (op == OP_MATMUL) {
        uint32_t m = U(F_MATMUL_M), n = U(F_MATMUL_N), k = U(F_MATMUL_K);
        if (k) {
            R(extent(U(F_MATMUL_A), m, EB(U(F_MATMUL_A_I16)) * k, U(F_MATMUL_A_STRIDE)), 0);
            R(extent(U(F_MATMUL_B), n, k, U(F_MATMUL_B_STRIDE)), 0);
        }
        span_t c = extent(U(F_MATMUL_C), m, 4 * n, U(F_MATMUL_C_STRIDE));
        W(c, 0);
        if (U(F_MATMUL_ACCUMULATE)) R(c, 0);
    } else if (op == OP_VMAP) {
        uint32_t rows = U(F_VMAP_ROWS), cols = U(F_VMAP_COLS);
        uint32_t es = U(F_VMAP_SRC_TYPE) ? 4 : EB(U(F_VMAP_SRC_I16));
        R(extent(U(F_VMAP_SRC), rows, es * cols, U(F_VMAP_SRC_STRIDE)), 0);
        if (U(F_VMAP_PER_COL) && rows && cols) {
            R(range(U(F_VMAP_MULTS), 4 * cols), 0);
            R(range(U(F_VMAP_SHIFTS), cols), 0);
        }
        W(extent(U(F_VMAP_DST), rows, EB(U(F_VMAP_DST_I16)) * cols, U(F_VMAP_DST_STRIDE)), 0);
    } else if (op == OP_VLUT) {
        uint32_t rows = U(F_VLUT_ROWS), cols = U(F_VLUT_COLS);
        if (rows && cols) {
            R(extent(U(F_VLUT_SRC), rows, cols, U(F_VLUT_SRC_STRIDE)), 0);
            R(range(U(F_VLUT_TABLE), LUT_BYTES), 0);
            W(extent(U(F_VLUT_DST), rows, cols, U(F_VLUT_DST_STRIDE)), 0);
        }
    } else if (op == OP_VMUL) {
        uint32_t rows = U(F_VMUL_ROWS), cols = U(F_VMUL_COLS);
        if (rows && cols) {
            R(extent(U(F_VMUL_A), rows, EB(U(F_VMUL_A_I16)) * cols, U(F_VMUL_A_STRIDE)), 0);
            R(extent(U(F_VMUL_B), rows, EB(U(F_VMUL_B_I16)) * cols, U(F_VMUL_B_STRIDE)), 0);
            W(extent(U(F_VMUL_DST), rows, EB(U(F_VMUL_DST_I16)) * cols, U(F_VMUL_DST_STRIDE)), 0);
        }
    } else if (op == OP_VADD) {
        uint32_t n = U(F_VADD_LEN);
        R(range(U(F_VADD_A), EB(U(F_VADD_A_I16)) * n), 0);
        R(range(U(F_VADD_B), EB(U(F_VADD_B_I16)) * n), 0);
        W(range(U(F_VADD_DST), EB(U(F_VADD_DST_I16)) * n), 0);
    } else if (op == OP_POOL) {
        uint32_t c = U(F_POOL_CHANNELS), oh = U(F_POOL_OUT_H), ow = U(F_POOL_OUT_W);
        if (c && oh && ow) {
            uint32_t in_rows = sadd(smul(oh - 1, U(F_POOL_SH)), U(F_POOL_KH));
            R(range(U(F_POOL_SRC), smul(smul(smul(in_rows, U(F_POOL_IN_W)), c), EB(U(F_POOL_SRC_I16)))), 0);
            W(range(U(F_POOL_DST), smul(smul(smul(oh, ow), c), EB(U(F_POOL_DST_I16)))), 0);
        }
    }
#undef R
#undef W
    return 0;
}

static int overlaps(span_t a, span_t b) {
    return !empty(a) && !empty(b) && a.start < b.end && b.start < a.end;
}

/* _check_overlap: a destination may overlap a source only as the identical element-wise operand */
static int bad_overlap(const instr_t *ins) {
    int op = OPC(ins);
    if ((op == OP_VMAP && !U(F_VMAP_SRC_TYPE)) || op == OP_VLUT) {
        uint32_t rows, cols, src, dst, ss, ds, es, ed;
        if (op == OP_VMAP) {
            rows = U(F_VMAP_ROWS); cols = U(F_VMAP_COLS); src = U(F_VMAP_SRC); dst = U(F_VMAP_DST);
            ss = U(F_VMAP_SRC_STRIDE); ds = U(F_VMAP_DST_STRIDE);
            es = EB(U(F_VMAP_SRC_I16)); ed = EB(U(F_VMAP_DST_I16));
        } else {
            rows = U(F_VLUT_ROWS); cols = U(F_VLUT_COLS); src = U(F_VLUT_SRC); dst = U(F_VLUT_DST);
            ss = U(F_VLUT_SRC_STRIDE); ds = U(F_VLUT_DST_STRIDE); es = ed = 1;
        }
        if (!(src == dst && ss == ds && es == ed))
            return overlaps(extent(src, rows, es * cols, ss), extent(dst, rows, ed * cols, ds));
    } else if (op == OP_VMUL) {
        uint32_t rows = U(F_VMUL_ROWS), cols = U(F_VMUL_COLS), dst = U(F_VMUL_DST), ds = U(F_VMUL_DST_STRIDE);
        uint32_t ed = EB(U(F_VMUL_DST_I16));
        span_t d = extent(dst, rows, ed * cols, ds);
        uint32_t x[2] = {U(F_VMUL_A), U(F_VMUL_B)}, xs[2] = {U(F_VMUL_A_STRIDE), U(F_VMUL_B_STRIDE)};
        uint32_t xe[2] = {EB(U(F_VMUL_A_I16)), EB(U(F_VMUL_B_I16))};
        for (int k = 0; k < 2; k++)
            if (!(x[k] == dst && xs[k] == ds && xe[k] == ed) && overlaps(extent(x[k], rows, xe[k] * cols, xs[k]), d))
                return 1;
    } else if (op == OP_VADD) {
        uint32_t n = U(F_VADD_LEN), dst = U(F_VADD_DST), ed = EB(U(F_VADD_DST_I16));
        uint32_t x[2] = {U(F_VADD_A), U(F_VADD_B)}, xe[2] = {EB(U(F_VADD_A_I16)), EB(U(F_VADD_B_I16))};
        for (int k = 0; k < 2; k++)
            if (!(x[k] == dst && xe[k] == ed) && overlaps(range(x[k], xe[k] * n), range(dst, ed * n)))
                return 1;
    } else if (op == OP_POOL) {
        use_t r[4], w[2];
        int nr, nw;
        footprint(ins, r, &nr, w, &nw);
        if (nr && nw) return overlaps(r[0].s, w[0].s);
    }
    return 0;
}

int check(instr_t *ins) {
    int op = OPC(ins);
    unsigned end = FORMAT_END[op];
    if (!end) return E_ILLEGAL_OPCODE;
    if ((ins->raw.w[0] >> 12) & 15) return E_ILLEGAL_FIELD;
    decode(ins);
    for (unsigned k = 0; k < sizeof ENUMS / sizeof ENUMS[0]; k++)
        if (ENUMS[k][0] == op && U(ENUMS[k][1]) >= ENUMS[k][2]) return E_ILLEGAL_FIELD;
    unsigned k = end >> 5; /* reserved bits above the last field: the rest of its word, the words after */
    if (k < 8) {
        const uint32_t *w = ins->raw.w;
        uint32_t bad = w[k] & (~0u << (end & 31));
        switch (k) { /* the whole words after it, unrolled */
        case 0: bad |= w[1]; /* fall through */
        case 1: bad |= w[2]; /* fall through */
        case 2: bad |= w[3]; /* fall through */
        case 3: bad |= w[4]; /* fall through */
        case 4: bad |= w[5]; /* fall through */
        case 5: bad |= w[6]; /* fall through */
        case 6: bad |= w[7];
        }
        if (bad) return E_ILLEGAL_FIELD;
    }
    /* tokens */
    int unit = unit_of(ins);
    uint32_t tokens = WAIT(ins) | SIGNAL(ins);
    if (unit < 0 && tokens) return E_ILLEGAL_FIELD;
    if (unit >= 0 && ((tokens >> unit) & 1)) return E_ILLEGAL_FIELD;
    if (unit < 0 || op == OP_SYNC) return 0; /* no operands: no rule below applies */
    /* field rules */
    int shift = -1, lo = 0, hi = 0, has_clamp = 0;
    switch (op) {
    case OP_VMAP: shift = U(F_VMAP_SHIFT); lo = S(SF_VMAP_LO); hi = S(SF_VMAP_HI); has_clamp = 1; break;
    case OP_VADD: shift = U(F_VADD_SHIFT); lo = S(SF_VADD_LO); hi = S(SF_VADD_HI); has_clamp = 1; break;
    case OP_POOL: shift = U(F_POOL_SHIFT); lo = S(SF_POOL_LO); hi = S(SF_POOL_HI); has_clamp = 1; break;
    case OP_VMUL: shift = U(F_VMUL_SHIFT); lo = S(SF_VMUL_LO); hi = S(SF_VMUL_HI); has_clamp = 1; break;
    }
    if (shift > MAX_SHIFT) return E_ILLEGAL_FIELD;
    if (has_clamp && lo > hi) return E_ILLEGAL_FIELD;
    if (op == OP_VMAP && U(F_VMAP_SRC_TYPE) && S(SF_VMAP_ZP_IN)) return E_ILLEGAL_FIELD;
    if (op == OP_VMAP && U(F_VMAP_SRC_TYPE) && U(F_VMAP_SRC_I16)) return E_ILLEGAL_FIELD;
    if (op == OP_LOAD && U(F_LOAD_PAD_I16) && ((U(F_LOAD_PAD_LEFT) | U(F_LOAD_PAD_RIGHT)) & 1)) return E_ILLEGAL_FIELD;
    if (op == OP_VMAP && U(F_VMAP_PER_COL) && U(F_VMAP_COLS) > PER_COL_MAX) return E_ILLEGAL_FIELD;
    if (op == OP_POOL && U(F_POOL_CHANNELS) && U(F_POOL_OUT_H) && U(F_POOL_OUT_W)) {
        if (!U(F_POOL_KH) || !U(F_POOL_KW) || !U(F_POOL_SH) || !U(F_POOL_SW)) return E_ILLEGAL_FIELD;
        if (sadd(smul(U(F_POOL_OUT_W) - 1, U(F_POOL_SW)), U(F_POOL_KW)) > U(F_POOL_IN_W)) return E_ILLEGAL_FIELD;
    }
    if (op == OP_LOAD) {
        uint32_t tw = U(F_LOAD_PAD_LEFT) + U(F_LOAD_COLS) + U(F_LOAD_PAD_RIGHT);
        uint32_t tr = U(F_LOAD_PAD_TOP) + U(F_LOAD_ROWS) + U(F_LOAD_PAD_BOTTOM);
        if (U(F_LOAD_SPAD_STRIDE) < tw && tr > 1) return E_ILLEGAL_FIELD;
    }
    /* alignment */
    if (op == OP_MATMUL) {
        if ((U(F_MATMUL_A) | U(F_MATMUL_A_STRIDE) | U(F_MATMUL_B) | U(F_MATMUL_B_STRIDE)) & (lanes - 1))
            return E_MISALIGNED;
        if ((U(F_MATMUL_C) | U(F_MATMUL_C_STRIDE)) & (acc_row_bytes - 1)) return E_MISALIGNED; /* a power of two */
    }
    if (op == OP_VMAP && U(F_VMAP_SRC_TYPE) && ((U(F_VMAP_SRC) | U(F_VMAP_SRC_STRIDE)) & 3)) return E_MISALIGNED;
    /* address ranges: every read then every write */
    use_t r[4], w[2];
    int nr, nw;
    footprint(ins, r, &nr, w, &nw);
    for (int k = 0; k < nr + nw; k++) {
        use_t *u = k < nr ? &r[k] : &w[k - nr];
        if (empty(u->s)) continue;
        if (u->mem == 3) {
            if (u->s.end > dram_bytes) return E_DRAM_RANGE;
        } else if (!memory_of(u->s.start, u->s.end)) {
            return E_SPAD_RANGE;
        }
    }
    /* the memory each operand must lie in (npu.isa._required_memories), on footprint's spans */
    if (op == OP_MATMUL) {
        uint32_t m = U(F_MATMUL_M), n = U(F_MATMUL_N), k = U(F_MATMUL_K);
        span_t c = w[0].s; /* and with k, A and B the first two reads */
        if (k && m && !empty(r[0].s) && memory_of(r[0].s.start, r[0].s.end) != 1) return E_SPAD_RANGE;
        if (k && n && !empty(r[1].s) && memory_of(r[1].s.start, r[1].s.end) != 1) return E_SPAD_RANGE;
        if (!empty(c) && memory_of(c.start, c.end) != 2) return E_SPAD_RANGE;
    } else if (op == OP_VMAP) {
        uint32_t rows = U(F_VMAP_ROWS), cols = U(F_VMAP_COLS), i32 = U(F_VMAP_SRC_TYPE);
        span_t s = r[0].s, d = w[0].s; /* with per-column factors, their spans the next two reads */
        if (!empty(s) && memory_of(s.start, s.end) != (i32 ? 2 : 1)) return E_SPAD_RANGE;
        if (!empty(d) && memory_of(d.start, d.end) != 1) return E_SPAD_RANGE;
        if (U(F_VMAP_PER_COL) && rows && cols) {
            if (memory_of(r[1].s.start, r[1].s.end) != 1 || memory_of(r[2].s.start, r[2].s.end) != 1)
                return E_SPAD_RANGE;
        }
    } else if (op == OP_VADD || op == OP_POOL || op == OP_VLUT || op == OP_VMUL) {
        for (int k = 0; k < nr + nw; k++) {
            use_t *u = k < nr ? &r[k] : &w[k - nr];
            if (!empty(u->s) && memory_of(u->s.start, u->s.end) != 1) return E_SPAD_RANGE;
        }
    }
    if (bad_overlap(ins)) return E_ILLEGAL_FIELD;
    /* the run's memory window, after every ISA rule: a LOAD's or STORE's DRAM range (PROTECTION) */
    for (int k = 0; k < nr + nw; k++) {
        use_t *u = k < nr ? &r[k] : &w[k - nr];
        if (u->mem == 3 && !empty(u->s) && (u->s.start < win_lo || u->s.end > win_hi)) {
            fault_addr = u->s.start;
            return E_PROTECTION;
        }
    }
    return 0;
}
