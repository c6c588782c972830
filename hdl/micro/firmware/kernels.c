/* Each unit instruction's data effect, bit-exact with sim/golden/kernels.py (the golden model). Element
   loops in order: a destination identical to its source element-wise is read before written; a
   destination that may overlap a parameter (per-column scales, the VLUT table) gets a copy first. */
#include "fw.h"

static inline volatile uint8_t *at(uint32_t a) { return ONCHIP + a; }

#define NOINLINE __attribute__((noinline)) /* one copy of the helpers: the ROM is small */

static NOINLINE int32_t elem(uint32_t a, int i16) {
    if (!i16) return (int8_t)*at(a);
    return (int16_t)(*at(a) | (*at(a + 1) << 8));
}

static NOINLINE void put(uint32_t a, int32_t v, int i16) {
    *at(a) = (uint8_t)v;
    if (i16) *at(a + 1) = (uint8_t)(v >> 8);
}

static NOINLINE int32_t clamp(int64_t v, int32_t lo, int32_t hi) { return v < lo ? lo : v > hi ? hi : (int32_t)v; }

/* clamp(rsr(p, s) + zp, lo, hi) for any shift up to MAX_SHIFT, in 32-bit halves: the compiler's
   64-bit shifts branch and call, and the processor shifts 4 bits a cycle. Models requantise with
   shifts past 32 (a 31-bit multiplier), so both ranges take this path */
static inline __attribute__((always_inline)) int32_t requant(int64_t p, unsigned s, int32_t zp, int32_t lo,
                                                             int32_t hi) {
    uint32_t pl = (uint32_t)p, ph = (uint32_t)((uint64_t)p >> 32), yl;
    int32_t yh;
    if (!s) {
        yl = pl;
        yh = (int32_t)ph;
    } else if (s < 32) { /* p + 2^(s - 1), then both halves shifted */
        uint32_t ql = pl + (1u << (s - 1)), qh = ph + (ql < pl);
        yl = ql >> s | qh << (32 - s);
        yh = (int32_t)qh >> s;
    } else { /* the rounding bit in the high half (s = 32: the low half's top bit) */
        uint32_t ql = pl + (s == 32 ? 0x80000000u : 0), qh = ph + (ql < pl) + (s == 32 ? 0 : 1u << (s - 33));
        yl = (uint32_t)((int32_t)qh >> (s - 32));
        yh = (int32_t)qh >> 31;
    }
    int64_t v = (int64_t)((uint64_t)(uint32_t)yh << 32 | yl) + zp;
    return v < lo ? lo : v > hi ? hi : (int32_t)v;
}

/* the clamp bounds: lo, hi for int8, lo * 256 .. hi * 256 + 255 for an int16 destination */
static void bounds(int32_t *lo, int32_t *hi, int dst_i16) {
    if (dst_i16) { *lo *= 256; *hi = *hi * 256 + 255; }
}

#define DRAM32(a) (*(volatile uint32_t *)(DRAM_BASE + (a)))
#define ON32(a) (*(volatile uint32_t *)(ONCHIP_BASE + (a)))

/* DRAM bytes through a one-word buffer: one bus beat per word, not per byte */
static uint32_t buf_addr, buf_word; /* exec_load empties it (address 1) first */
static uint8_t dram_byte(uint32_t a) {
    if ((a & ~3u) != buf_addr) {
        buf_addr = a & ~3u;
        buf_word = DRAM32(buf_addr);
    }
    return (uint8_t)(buf_word >> (8 * (a & 3)));
}

/* bytes c0 .. c1 - 1 of a padded row at `row`: pad_value, or (int16 padding) zero at even columns */
static void pad_row(uint32_t row, uint32_t c0, uint32_t c1, uint8_t pv, int i16) {
    uint32_t c = c0;
    for (; c < c1 && ((row + c) & 3); c++) *at(row + c) = (i16 && !(c & 1)) ? 0 : pv;
    if (c + 4 <= c1) {
        uint32_t odd = pv * 0x01010101u, even = i16 ? odd & 0xff00ff00u : odd;
        if (c & 1) even = i16 ? odd & 0x00ff00ffu : odd; /* the word starts at an odd column */
        for (; c + 4 <= c1; c += 4) ON32(row + c) = even;
    }
    for (; c < c1; c++) *at(row + c) = (i16 && !(c & 1)) ? 0 : pv;
}

static NOINLINE void exec_load(const instr_t *ins) {
    uint32_t rows = U(F_LOAD_ROWS), cols = U(F_LOAD_COLS), pt = U(F_LOAD_PAD_TOP), pl = U(F_LOAD_PAD_LEFT);
    uint32_t tr = pt + rows + U(F_LOAD_PAD_BOTTOM), tw = pl + cols + U(F_LOAD_PAD_RIGHT);
    uint32_t spad = U(F_LOAD_SPAD), ss = U(F_LOAD_SPAD_STRIDE), dram = U(F_LOAD_DRAM), ds = U(F_LOAD_DRAM_STRIDE);
    uint8_t pv = (uint8_t)U(F_LOAD_PAD_VALUE);
    int i16 = U(F_LOAD_PAD_I16);
    if (!tr || !tw) return;
    buf_addr = 1; /* the host may have written DRAM since */
    for (uint32_t r = 0; r < tr; r++) {
        uint32_t row = spad + r * ss;
        if (r < pt || r >= pt + rows || !cols) {
            pad_row(row, 0, tw, pv, i16);
            continue;
        }
        pad_row(row, 0, pl, pv, i16);
        uint32_t src = dram + (r - pt) * ds, dst = row + pl, n = cols, c = 0;
        if (!((src ^ dst) & 3)) {
            for (; c < n && ((dst + c) & 3); c++) *at(dst + c) = dram_byte(src + c);
            for (; c + 4 <= n; c += 4) ON32(dst + c) = DRAM32(src + c);
        }
        for (; c < n; c++) *at(dst + c) = dram_byte(src + c);
        pad_row(row, pl + cols, tw, pv, i16);
    }
}

static NOINLINE void exec_store(const instr_t *ins) {
    uint32_t rows = U(F_STORE_ROWS), cols = U(F_STORE_COLS), spad = U(F_STORE_SPAD), ss = U(F_STORE_SPAD_STRIDE);
    uint32_t dram = U(F_STORE_DRAM), ds = U(F_STORE_DRAM_STRIDE);
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t src = spad + r * ss, dst = dram + r * ds, c = 0;
        for (; c < cols && ((dst + c) & 3); c++) DRAM[dst + c] = *at(src + c);
        for (; c + 4 <= cols; c += 4) {
            uint32_t s = src + c;
            DRAM32(dst + c) = (s & 3) ? (*at(s) | *at(s + 1) << 8 | *at(s + 2) << 16 | (uint32_t)*at(s + 3) << 24)
                                      : ON32(s);
        }
        for (; c < cols; c++) DRAM[dst + c] = *at(src + c);
    }
}

/* MATMUL's dot products run on the MAC array (hdl/micro/mac.py): four B rows staged into its
   columns, then every A row run against them (four outputs a run), in chunks of k of at most
   MAC_MAX_WORDS entries. Rows are word-aligned (check() asks `lanes`-aligned ones, and every
   configuration has lanes >= 4); a row's last word may hold fewer than four k positions (`tail`
   bytes of A: the array takes the rest as zeros). */
#define MAC_SUM(j) MMIO(MMIO_MAC_SUM0 + 4 * (j))

/* MATMUL in blocks of MAC_COLUMNS B rows and at most `chunk` k positions: each block's B rows staged,
   then every A row run against them. The array's sums lack MAC_OFFSET_I8 a word run (MAC_OFFSET_LO in
   MAC_MODE_LO), which `fix` adds back. One function with running pointers: a block costs no call. */
static NOINLINE void exec_matmul(const instr_t *ins) {
    uint32_t m = U(F_MATMUL_M), n = U(F_MATMUL_N), k = U(F_MATMUL_K), as = U(F_MATMUL_A_STRIDE) >> 2;
    uint32_t bs = U(F_MATMUL_B_STRIDE), cs = U(F_MATMUL_C_STRIDE);
    int i16 = U(F_MATMUL_A_I16), acc = U(F_MATMUL_ACCUMULATE);
    uint32_t chunk = (i16 ? 2 : 4) * MAC_MAX_WORDS, stage_i16 = i16 ? MAC_STAGE_I16 : 0;
    uint32_t b0 = U(F_MATMUL_B), c0 = U(F_MATMUL_C);
    for (uint32_t j0 = 0; j0 < n; j0 += MAC_COLUMNS, b0 += MAC_COLUMNS * bs, c0 += 4 * MAC_COLUMNS) {
        uint32_t cols = n - j0 < MAC_COLUMNS ? n - j0 : MAC_COLUMNS;
        for (uint32_t k0 = 0; k0 < k; k0 += chunk) {
            uint32_t kc = k - k0 < chunk ? k - k0 : chunk, bw = (kc + 3) >> 2;
            uint32_t words = i16 ? (kc + 1) >> 1 : bw, tail = i16 ? (kc & 1) << 1 : kc & 3;
            uint32_t b = b0 + k0, stage = bw << MAC_COUNT_SHIFT | stage_i16;
            for (uint32_t j = 0; j < cols; j++, b += bs) MMIO(MMIO_MAC_STAGE) = stage | b >> 2 | j << MAC_SEL_SHIFT;
            /* the run's command; a row's A word is `as` words on */
            uint32_t run = (U(F_MATMUL_A) + (k0 << i16)) >> 2 | words << MAC_COUNT_SHIFT | tail << MAC_TAIL_SHIFT;
            uint32_t fix = words * MAC_OFFSET_I8, fix_lo = words * MAC_OFFSET_LO;
            int keep = k0 || acc;
            volatile uint32_t *cp = (volatile uint32_t *)at(c0);
            for (uint32_t i = 0; i < m; i++, run += as, cp = (volatile uint32_t *)((uintptr_t)cp + cs)) {
                if (i16) { /* 256 x the high bytes' products + the low bytes' */
                    uint32_t hi[MAC_COLUMNS];
                    MMIO(MMIO_MAC_RUN) = run | MAC_MODE_HI << MAC_SEL_SHIFT;
                    for (uint32_t j = 0; j < cols; j++) hi[j] = ((MAC_SUM(j) + fix) << 8) + fix_lo;
                    MMIO(MMIO_MAC_RUN) = run | MAC_MODE_LO << MAC_SEL_SHIFT;
                    for (uint32_t j = 0; j < cols; j++) cp[j] = (keep ? cp[j] : 0) + hi[j] + MAC_SUM(j);
                    continue;
                }
                MMIO(MMIO_MAC_RUN) = run;
                if (cols == MAC_COLUMNS && keep) { /* the usual blocks, unrolled */
                    cp[0] += MAC_SUM(0) + fix;
                    cp[1] += MAC_SUM(1) + fix;
                    cp[2] += MAC_SUM(2) + fix;
                    cp[3] += MAC_SUM(3) + fix;
                } else if (cols == MAC_COLUMNS) {
                    cp[0] = MAC_SUM(0) + fix;
                    cp[1] = MAC_SUM(1) + fix;
                    cp[2] = MAC_SUM(2) + fix;
                    cp[3] = MAC_SUM(3) + fix;
                } else {
                    for (uint32_t j = 0; j < cols; j++) cp[j] = (keep ? cp[j] : 0) + MAC_SUM(j) + fix;
                }
            }
        }
    }
    if (k || acc) return;
    for (uint32_t i = 0; i < m; i++) /* k = 0: C = 0 */
        for (uint32_t j = 0; j < n; j++) ((volatile uint32_t *)at(U(F_MATMUL_C) + i * cs))[j] = 0;
}

static uint8_t table[LUT_BYTES] __attribute__((section(".noinit")));
static int32_t col_mult[PER_COL_MAX] __attribute__((section(".noinit")));
static uint8_t col_shift[PER_COL_MAX] __attribute__((section(".noinit")));

/* a row of VMAP's usual case - accumulators in, one scale for every column - with nothing else
   live: the general loop keeps more values than RV32I has registers and spilled about 90 cycles
   an element */
static NOINLINE void vmap_row_i32(const volatile uint32_t *x, volatile uint8_t *d, uint32_t cols, int32_t m,
                                  unsigned s, int32_t zp, int32_t lo, int32_t hi, int d16) {
    for (uint32_t c = 0; c < cols; c++) {
        int32_t v = requant((int64_t)(int32_t)x[c] * m, s, zp, lo, hi);
        *d++ = (uint8_t)v;
        if (d16) *d++ = (uint8_t)(v >> 8);
    }
}

static NOINLINE void exec_vmap(const instr_t *ins) {
    uint32_t rows = U(F_VMAP_ROWS), cols = U(F_VMAP_COLS), src = U(F_VMAP_SRC), dst = U(F_VMAP_DST);
    uint32_t ss = U(F_VMAP_SRC_STRIDE), ds = U(F_VMAP_DST_STRIDE);
    int i32 = U(F_VMAP_SRC_TYPE), si16 = U(F_VMAP_SRC_I16), di16 = U(F_VMAP_DST_I16), per_col = U(F_VMAP_PER_COL);
    int32_t zp_in = S(SF_VMAP_ZP_IN), zp_out = S(SF_VMAP_ZP_OUT), lo = S(SF_VMAP_LO), hi = S(SF_VMAP_HI);
    int32_t mult = S(SF_VMAP_MULT);
    unsigned shift = U(F_VMAP_SHIFT);
    if (!rows || !cols) return;
    bounds(&lo, &hi, di16);
    if (per_col) {
        uint32_t mu = U(F_VMAP_MULTS), sh = U(F_VMAP_SHIFTS);
        for (uint32_t c = 0; c < cols; c++) {
            col_mult[c] = (int32_t)(*at(mu + 4 * c) | *at(mu + 4 * c + 1) << 8 | *at(mu + 4 * c + 2) << 16 |
                                    (uint32_t)*at(mu + 4 * c + 3) << 24);
            uint8_t s = *at(sh + c) & 63;
            col_shift[c] = s > MAX_SHIFT ? MAX_SHIFT : s;
        }
    }
    if (i32 && !per_col) {
        for (uint32_t r = 0; r < rows; r++)
            vmap_row_i32((const volatile uint32_t *)at(src + r * ss), at(dst + r * ds), cols, mult, shift, zp_out, lo,
                         hi, di16);
        return;
    }
    unsigned es = i32 ? 4 : si16 ? 2 : 1, ed = di16 ? 2 : 1;
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t a = src + r * ss, d = dst + r * ds;
        for (uint32_t c = 0; c < cols; c++, a += es, d += ed) {
            int32_t x = i32 ? (int32_t)*(volatile uint32_t *)at(a) : elem(a, si16) - zp_in;
            int32_t m = per_col ? col_mult[c] : mult;
            unsigned s = per_col ? col_shift[c] : shift;
            int32_t v = requant((int64_t)x * m, s, zp_out, lo, hi);
            *at(d) = (uint8_t)v;
            if (di16) *at(d + 1) = (uint8_t)(v >> 8);
        }
    }
}

static NOINLINE void exec_vlut(const instr_t *ins) {
    uint32_t rows = U(F_VLUT_ROWS), cols = U(F_VLUT_COLS), src = U(F_VLUT_SRC), dst = U(F_VLUT_DST);
    uint32_t ss = U(F_VLUT_SRC_STRIDE), ds = U(F_VLUT_DST_STRIDE), t = U(F_VLUT_TABLE);
    if (!rows || !cols) return;
    for (unsigned k = 0; k < LUT_BYTES; k++) table[k] = *at(t + k);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++) *at(dst + r * ds + c) = table[*at(src + r * ss + c) ^ 0x80];
}

static NOINLINE void exec_vmul(const instr_t *ins) {
    uint32_t rows = U(F_VMUL_ROWS), cols = U(F_VMUL_COLS), a = U(F_VMUL_A), b = U(F_VMUL_B), d = U(F_VMUL_DST);
    uint32_t as = U(F_VMUL_A_STRIDE), bs = U(F_VMUL_B_STRIDE), dstr = U(F_VMUL_DST_STRIDE);
    int ai = U(F_VMUL_A_I16), bi = U(F_VMUL_B_I16), di = U(F_VMUL_DST_I16);
    int32_t zpa = S(SF_VMUL_ZP_A), zpb = S(SF_VMUL_ZP_B), zpo = S(SF_VMUL_ZP_OUT), lo = S(SF_VMUL_LO), hi = S(SF_VMUL_HI);
    int32_t mult = S(SF_VMUL_MULT);
    unsigned shift = U(F_VMUL_SHIFT);
    bounds(&lo, &hi, di);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++) {
            int64_t x = (int64_t)(elem(a + r * as + (c << ai), ai) - zpa) * (elem(b + r * bs + (c << bi), bi) - zpb);
            put(d + r * dstr + (c << di), requant(x * mult, shift, zpo, lo, hi), di);
        }
}

static NOINLINE void exec_vadd(const instr_t *ins) {
    uint32_t n = U(F_VADD_LEN), a = U(F_VADD_A), b = U(F_VADD_B), d = U(F_VADD_DST);
    int ai = U(F_VADD_A_I16), bi = U(F_VADD_B_I16), di = U(F_VADD_DST_I16);
    int32_t zpa = S(SF_VADD_ZP_A), zpb = S(SF_VADD_ZP_B), zpo = S(SF_VADD_ZP_OUT), lo = S(SF_VADD_LO), hi = S(SF_VADD_HI);
    int32_t ma = S(SF_VADD_MULT_A), mb = S(SF_VADD_MULT_B);
    unsigned shift = U(F_VADD_SHIFT);
    bounds(&lo, &hi, di);
    for (uint32_t i = 0; i < n; i++) {
        int64_t s = (int64_t)(elem(a + (i << ai), ai) - zpa) * ma + (int64_t)(elem(b + (i << bi), bi) - zpb) * mb;
        put(d + (i << di), requant(s, shift, zpo, lo, hi), di);
    }
}

static NOINLINE void exec_pool(const instr_t *ins) {
    uint32_t C = U(F_POOL_CHANNELS), W = U(F_POOL_IN_W), oh = U(F_POOL_OUT_H), ow = U(F_POOL_OUT_W);
    uint32_t kh = U(F_POOL_KH), kw = U(F_POOL_KW), sh = U(F_POOL_SH), sw = U(F_POOL_SW);
    uint32_t src = U(F_POOL_SRC), dst = U(F_POOL_DST);
    int si = U(F_POOL_SRC_I16), di = U(F_POOL_DST_I16), avg = U(F_POOL_MODE);
    int32_t zpi = S(SF_POOL_ZP_IN), zpo = S(SF_POOL_ZP_OUT), lo = S(SF_POOL_LO), hi = S(SF_POOL_HI);
    int32_t mult = S(SF_POOL_MULT);
    unsigned shift = U(F_POOL_SHIFT);
    bounds(&lo, &hi, di);
    uint32_t o = dst;
    /* a pixel's, a window row's and an output row's steps in bytes (no multiply in the loops: the
       processor's take 18 cycles) */
    uint32_t cstep = C << si, rstep = W * cstep, xstep = sw * cstep, ystep = sh * rstep;
    for (uint32_t y = 0, row = src; y < oh; y++, row += ystep)
        for (uint32_t x = 0, pix = row; x < ow; x++, pix += xstep)
            for (uint32_t c = 0; c < C; c++) {
                int64_t acc = 0;
                int32_t best = -0x8000 - 1;
                for (uint32_t i = 0, p = pix + (c << si); i < kh; i++, p += rstep)
                    for (uint32_t j = 0, q = p; j < kw; j++, q += cstep) {
                        int32_t v = elem(q, si);
                        acc += v;
                        if (v > best) best = v;
                    }
                int32_t out;
                if (!avg) out = clamp(best, lo, hi);
                else out = requant((acc - (int64_t)kh * kw * zpi) * mult, shift, zpo, lo, hi);
                put(o, out, di);
                o += 1u << di;
            }
}

void execute(const instr_t *ins) {
    switch (OPC(ins)) {
    case OP_LOAD: exec_load(ins); break;
    case OP_STORE: exec_store(ins); break;
    case OP_MATMUL: exec_matmul(ins); break;
    case OP_VMAP: exec_vmap(ins); break;
    case OP_VLUT: exec_vlut(ins); break;
    case OP_VMUL: exec_vmul(ins); break;
    case OP_VADD: exec_vadd(ins); break;
    case OP_POOL: exec_pool(ins); break;
    }
}
