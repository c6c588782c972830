/* The dispatcher, the four unit queues, the tokens, pauses, fences, the command ring and the
   registers: sim/golden/model.py's rules run one step at a time. Each step either dispatches the next
   instruction (while it can: a queue slot is free, or END / BARRIER find every queue drained) or
   runs the oldest queue head whose tokens have arrived. */
#include "fw.h"

/* the compiler's struct copies (instructions, queue entries: whole words) */
void *memcpy(void *d, const void *s, unsigned n) {
    uint8_t *dp = d;
    const uint8_t *sp = s;
    if (!(((uint32_t)dp | (uint32_t)sp | n) & 3)) {
        for (uint32_t *dw = d, *end = (uint32_t *)(dp + n); dw < end;) *dw++ = *(const uint32_t *)sp, sp += 4;
        return d;
    }
    while (n--) *dp++ = *sp++;
    return d;
}

uint32_t spad_bytes, acc_bytes, dram_bytes, lanes, acc_row_bytes, queue_depth, token_depth;
uint32_t win_lo, fault_addr;
uint64_t win_hi;

#define QMAX QUEUE_LIMIT /* hdl/micro/core.py refuses a deeper queue_depth */
#define UNITS 4
/* an instruction checked and decoded once, at dispatch; point: a cancel point's ordinal */
/* a cancel point's or fence's marker keeps only its opcode word (and the point's id) */
typedef struct { instr_t ins; uint32_t pc, point, id; uint32_t pad[32 - 3 - sizeof(instr_t) / 4]; } entry_t;
/* 128 bytes: a slot's address is a shift, not a multiply (the processor's take 18 cycles) */
_Static_assert(sizeof(entry_t) == 128, "entry_t: 128 bytes");
/* not cleared at reset (a soft reset restarts the processor: its boot must be quick); start()
   empties the queues. A queue of queue_depth entries rings through queue_depth + 1 slots, so the
   slot past its tail is never live: a unit's instruction is fetched and decoded there, and pushing
   it copies nothing (a copy of the 108-byte instruction took about 570 cycles) */
static entry_t queue[UNITS][QMAX + 1] __attribute__((section(".noinit")));
static uint32_t q_len[UNITS];
static entry_t *qrow[UNITS]; /* queue[u], set once: no multiply by a row's size */
static entry_t *qend[UNITS]; /* its last slot, &queue[u][queue_depth], set once */
static entry_t *qh[UNITS];   /* the head's slot */
static uint32_t tokens[UNITS][UNITS]; /* tokens[p][c]: pushed by unit p, not yet popped by c */
static uint32_t passed[UNITS], fence_passed[UNITS], points, target;
/* since[u]: unit u started anything (an instruction, a SYNC, a fence's marker) since its last
   cancellation point: until it has, a pause may still stop at that point */
static uint32_t since[UNITS];
static uint32_t held_pc; /* the last point the load unit passed: where a pause held past it stops */
static uint32_t held_id; /* that point's id */
static uint32_t running, ring, base, pc, ring_size, fence_count, pause_seen;

static uint32_t fetched_pc; /* the instruction fetched and checked, not yet dispatched (start() empties it) */
static uint64_t counter[9]; /* the counters after CYCLES, in register order */
enum { C_BUSY = 0, C_STALL = 4, C_RD = 5, C_WR = 6, C_INSTRET = 7 };

static uint32_t cycles(void) { return MMIO(MMIO_CYCLES_LO); }

static void write_counters(void) {
    for (int k = 0; k < 8; k++) {
        REG(R_BUSY_LOAD + 8 * k) = (uint32_t)counter[k];
        REG(R_BUSY_LOAD + 8 * k + 4) = (uint32_t)(counter[k] >> 32);
    }
}

/* one counter into its registers; its high word only once it is not zero (the counters only grow,
   and start() writes them all) */
static void write_counter(int k) {
    REG(R_BUSY_LOAD + 8 * k) = (uint32_t)counter[k];
    uint32_t hi = (uint32_t)(counter[k] >> 32);
    if (hi) REG(R_BUSY_LOAD + 8 * k + 4) = hi;
}

/* the ring is empty (pc reached the host's tail); `tail_seen` is read once per step, so a doorbell
   rung in the middle of a step cannot make it look both empty and not */
static uint32_t tail_seen;
static int starved(void) { return ring && pc == tail_seen; }

static int queues_empty(void) { return !(q_len[0] | q_len[1] | q_len[2] | q_len[3]); }

static int any_tokens(void) {
    for (int p = 0; p < UNITS; p++)
        for (int c = 0; c < UNITS; c++)
            if (tokens[p][c]) return 1;
    return 0;
}

/* end the run: the registers first, then the interrupt (the host reads them when it sees it) */
static void stop(uint32_t status, uint32_t code, uint32_t at_pc) {
    MMIO(MMIO_EVENTS) = ACT_STOP_COUNT | ACT_CONSUME_PAUSE;
    MMIO(MMIO_PAUSE_PROBE) = 0;
    write_counters();
    if (status == ST_ERROR) {
        REG(R_ERROR_CODE) = code;
        REG(R_ERROR_PC) = at_pc;
        if (code == E_PROTECTION) REG(R_FAULT_ADDR) = fault_addr;
    }
    REG(R_RING_HEAD) = status == ST_PAUSED ? REG(R_RESUME_PC) : pc;
    REG(R_STATUS) = status;
    running = 0;
    pause_seen = 0;
    for (int u = 0; u < UNITS; u++) q_len[u] = 0;
    MMIO(MMIO_EVENTS) = ACT_RAISE_IRQ;
}

/* RESUME_TOKENS0..2: a byte per channel, (producer, consumer) pairs of distinct units with the
   producer the outer loop (npu.registers.TOKEN_CHANNELS). START loads and clears them (usually
   zeros: no loop), a pause saves the channels' counts there. */
static void load_tokens(void) {
    uint32_t w[3];
    for (int i = 0; i < 3; i++) w[i] = REG(R_RESUME_TOKENS0 + 4 * i);
    if ((w[0] | w[1] | w[2]) == 0) {
        for (int u = 0; u < UNITS; u++)
            for (int c = 0; c < UNITS; c++) tokens[u][c] = 0;
        return;
    }
    int k = 0;
    for (int p = 0; p < UNITS; p++)
        for (int c = 0; c < UNITS; c++) {
            if (p == c) {
                tokens[p][c] = 0;
                continue;
            }
            tokens[p][c] = w[k >> 2] >> (8 * (k & 3)) & 255;
            k++;
        }
    for (int i = 0; i < 3; i++) REG(R_RESUME_TOKENS0 + 4 * i) = 0;
}

static void save_tokens(void) {
    uint32_t w[3] = {0, 0, 0};
    int k = 0;
    for (int p = 0; p < UNITS; p++)
        for (int c = 0; c < UNITS; c++) {
            if (p == c) continue;
            w[k >> 2] |= (tokens[p][c] & 255) << (8 * (k & 3));
            k++;
        }
    for (int i = 0; i < 3; i++) REG(R_RESUME_TOKENS0 + 4 * i) = w[i];
}

static void start(void) {
    for (int k = 0; k < 9; k++) counter[k] = 0;
    write_counters();
    REG(R_ERROR_CODE) = 0;
    REG(R_ERROR_PC) = 0;
    REG(R_FAULT_ADDR) = 0;
    win_lo = REG(R_DRAM_BASE);
    win_hi = REG(R_DRAM_LIMIT) ? REG(R_DRAM_LIMIT) : (uint64_t)1 << 32;
    ring_size = REG(R_RING_SIZE);
    ring = ring_size != 0;
    base = ring ? REG(R_RING_BASE) : REG(R_PROGRAM_BASE);
    pc = REG(R_RESUME_PC);
    for (int u = 0; u < UNITS; u++) {
        q_len[u] = passed[u] = since[u] = 0;
        qh[u] = qrow[u];
        fence_passed[u] = fence_count;
    }
    load_tokens();
    points = 0;
    fetched_pc = 0xffffffff; /* the host may have rewritten the program (a rewound ring) */
    target = pause_seen ? 1 : 0; /* a pause requested with START, or before the firmware took it */
    if (target) MMIO(MMIO_PAUSE_PROBE) = 0xc0000000u;
    running = 1;
    REG(R_RING_HEAD) = pc;
    REG(R_STATUS) = ST_RUNNING;
    MMIO(MMIO_EVENTS) = ACT_COUNT;
}

/* the host's CONTROL writes: a pause request (a level), START */
static void control(uint32_t ev) {
    int p = (ev & EV_PAUSE) != 0;
    if (p && !pause_seen && running) {
        /* the first point no unit has started anything after (at least the first) */
        uint32_t most = 0, least = 0;
        for (int u = 0; u < UNITS; u++) {
            most = passed[u] > most ? passed[u] : most;
            least = passed[u] + since[u] > least ? passed[u] + since[u] : least;
        }
        target = least ? least : 1;
        /* the bench's probe: the most passed, whether the target is the next point, valid */
        MMIO(MMIO_PAUSE_PROBE) = most | (target > most ? 0x40000000u : 0) | 0x80000000u;
    } else if (!p && pause_seen) {
        target = 0;
    }
    pause_seen = p;
    if (ev & EV_START) { /* STATUS reads RUNNING from the START write until this clears it */
        if (!running) start();
        MMIO(MMIO_EVENTS) = ACT_CLEAR_START;
    }
}

static instr_t *decode_slot(uint32_t w0, instr_t *own);

/* fetch the instruction at pc into `*out`: its unit's free queue slot (decode_slot, by the first
   word), else `own`; 0, or the error code (DRAM_RANGE, PROTECTION, BUS) */
static int fetch(instr_t *own, instr_t **out) {
    *out = own;
    uint64_t addr;
    int bad;
    if (ring) {
        uint32_t n = ring_size / 32;
        addr = base + (uint64_t)(pc & (n - 1)) * 32; /* n is a power of two (else the ring is refused) */
        bad = ring_size < 32 || (ring_size & (ring_size - 1)) || (uint64_t)base + ring_size > dram_bytes;
    } else {
        addr = base + (uint64_t)pc * 32;
        bad = addr + 32 > dram_bytes;
    }
    if ((base & 31) || bad) return E_DRAM_RANGE;
    if (ring ? base < win_lo || (uint64_t)base + ring_size > win_hi : addr < win_lo || addr + 32 > win_hi) {
        fault_addr = ring ? base : (uint32_t)addr;
        return E_PROTECTION;
    }
    MMIO(MMIO_EVENTS) = ACT_CLEAR_FAULT;
    volatile uint32_t *src = (volatile uint32_t *)(DRAM_BASE + (uint32_t)addr);
    uint32_t w0 = src[0];
    instr_t *ins = *out = decode_slot(w0, own); /* a faulting fetch's words only reach a free slot */
    ins->raw.w[0] = w0;
    for (int k = 1; k < 8; k++) ins->raw.w[k] = src[k];
    if (MMIO(MMIO_EVENTS) & EV_BUS_FAULT) return E_BUS;
    return 0;
}

/* the slot past unit u's tail */
static entry_t *tail_slot(int u) {
    entry_t *t = qh[u] + q_len[u];
    return t > qend[u] ? t - (queue_depth + 1) : t;
}

static entry_t *head(int u) { return qh[u]; }

/* the entry in tail_slot(u) joins the queue; a cancel point's or fence's marker (`ins` elsewhere:
   its opcode word, and the point's `id`) is written there first */
static void push(int u, const instr_t *ins, uint32_t point, uint32_t id) {
    entry_t *e = tail_slot(u);
    if (&e->ins != ins) e->ins.raw.w[0] = ins->raw.w[0];
    e->pc = pc;
    e->point = point;
    e->id = id;
    q_len[u]++;
}

/* where the instruction of first word `w0` will be decoded: its unit's free slot, or `own` (a
   control instruction, or one the checks will refuse) */
static instr_t *decode_slot(uint32_t w0, instr_t *own) {
    uint32_t op = w0 & 15;
    if (!FORMAT_END[op]) return own;
    int u = FORMAT_UNIT[op];
    if (op == OP_SYNC) { /* its unit: the field's low two bits (a wider value is refused by the checks) */
        unsigned pos = FIELDS[FIELD_START[OP_SYNC] + F_SYNC_UNIT] & 255;
        if (pos >= 32) return own; /* not in the first word (not so in this ISA) */
        u = (int)(w0 >> pos & 3);
    }
    return u >= 0 ? &tail_slot(u)->ins : own;
}

/* dispatch one instruction if the dispatcher can: 1 dispatched (or stopped), 0 it waits */
static int dispatch(void) {
    static instr_t own, *cur;
    static uint32_t fetch_err;
    if (starved()) return 0;
    if (fetched_pc != pc) {
        fetch_err = fetch(&own, &cur);
        if (!fetch_err) fetch_err = check(cur);
        fetched_pc = pc;
    }
    instr_t *ins = cur;
    if (fetch_err) {
        fetched_pc = 0xffffffff;
        stop(ST_ERROR, fetch_err, pc);
        return 1;
    }
    int op = OPC(ins), u = unit_of(ins);
    if (u >= 0) {
        if (q_len[u] >= queue_depth) return 0;
    } else if (op == OP_CANCEL_POINT || op == OP_FENCE) {
        for (int q = 0; q < UNITS; q++)
            if (q_len[q] >= queue_depth) return 0;
    } else if (!queues_empty()) {
        return 0; /* END and BARRIER wait for every queue to drain */
    }
    fetched_pc = 0xffffffff;
    counter[C_INSTRET]++;
    if (u >= 0) {
        push(u, ins, 0, 0);
    } else if (op == OP_CANCEL_POINT) {
        points++;
        for (int q = 0; q < UNITS; q++) push(q, ins, points, U(F_CANCEL_POINT_ID)); /* check() decoded it */
    } else if (op == OP_FENCE) {
        for (int q = 0; q < UNITS; q++) push(q, ins, 0, 0);
    } else if (op == OP_END) {
        if (any_tokens()) {
            stop(ST_ERROR, E_TOKEN, pc);
        } else {
            REG(R_RESUME_PC) = pc;
            for (int i = 0; i < 3; i++) REG(R_RESUME_TOKENS0 + 4 * i) = 0; /* every channel empty */
            stop(ST_DONE, 0, pc);
        }
        return 1;
    }
    pc++;
    REG(R_RING_HEAD) = pc;
    return 1;
}

/* can unit u start its queue head? */
static int ready(int u) {
    if (!q_len[u]) return 0;
    if (target && passed[u] >= target) return 0; /* past the target, nothing started: it holds */
    entry_t *e = head(u);
    int op = OPC(&e->ins);
    if (op == OP_CANCEL_POINT) return target != e->point; /* the target point parks the unit */
    if (op == OP_FENCE) return 1;
    uint32_t w = WAIT(&e->ins);
    for (int p = 0; p < UNITS; p++)
        if ((w >> p & 1) && !tokens[p][u]) return 0;
    return 1;
}

/* every unit parked at the target point: the pause completes */
static int parked(void) {
    if (!target) return 0;
    for (int u = 0; u < UNITS; u++) {
        if (passed[u] >= target) continue; /* holding past it */
        if (!q_len[u]) return 0;
        entry_t *e = head(u);
        if (OPC(&e->ins) != OP_CANCEL_POINT || e->point != target) return 0;
    }
    return 1;
}

/* run unit u's queue head; returns the cycles it took */
static uint32_t run_head(int u) {
    entry_t *e = head(u);
    const instr_t *ins = &e->ins; /* not overwritten before it has run: nothing is pushed meanwhile */
    uint32_t at = e->pc, op = OPC(ins);
    qh[u] = qh[u] == qend[u] ? qrow[u] : qh[u] + 1;
    q_len[u]--;
    if (op == OP_CANCEL_POINT) {
        passed[u]++;
        since[u] = 0;
        if (u == 0) {
            held_pc = at;
            held_id = e->id;
        }
        return 1;
    }
    since[u] = 1;
    if (op == OP_FENCE) {
        fence_passed[u]++;
        uint32_t least = fence_passed[0];
        for (int q = 1; q < UNITS; q++) least = fence_passed[q] < least ? fence_passed[q] : least;
        if (least > fence_count) {
            fence_count++;
            REG(R_FENCE_COUNT) = fence_count;
            write_counter(C_INSTRET); /* as the host may read them at the interrupt */
            write_counter(C_STALL);
            MMIO(MMIO_EVENTS) = ACT_RAISE_IRQ;
        }
        return 1;
    }
    uint32_t w = WAIT(ins);
    for (int p = 0; p < UNITS; p++)
        if (w >> p & 1) tokens[p][u]--;
    uint32_t t0 = cycles();
    MMIO(MMIO_EVENTS) = ACT_CLEAR_FAULT;
    execute(ins);
    int faulted = (op == OP_LOAD || op == OP_STORE) && (MMIO(MMIO_EVENTS) & EV_BUS_FAULT);
    uint32_t d = cycles() - t0;
    counter[C_BUSY + u] += d;
    if (op == OP_LOAD) counter[C_RD] += (uint64_t)U(F_LOAD_ROWS) * U(F_LOAD_COLS);
    if (op == OP_STORE) counter[C_WR] += (uint64_t)U(F_STORE_ROWS) * U(F_STORE_COLS);
    if (faulted) {
        stop(ST_ERROR, E_BUS, at);
        return d;
    }
    uint32_t s = SIGNAL(ins);
    for (int c = 0; c < UNITS; c++)
        if (s >> c & 1) {
            if (tokens[u][c] >= token_depth) {
                stop(ST_ERROR, E_TOKEN, at);
                return d;
            }
            tokens[u][c]++;
        }
    return d;
}

/* one step of a run */
static void step(uint32_t ev) {
    tail_seen = REG(R_RING_TAIL);
    if (ev & EV_TIMEOUT) {
        stop(ST_ERROR, E_TIMEOUT, pc);
        return;
    }
    if (dispatch()) return;
    if (parked()) {
        /* the point's marker at the load unit's queue head, or the one it passed and holds at */
        int held = passed[0] >= target;
        uint32_t at = held ? held_pc : head(0)->pc;
        /* tokens pushed before the point for instructions after it: kept for the resume */
        save_tokens();
        REG(R_RESUME_PC) = at + 1;
        REG(R_CP_ID) = held ? held_id : head(0)->id;
        stop(ST_PAUSED, 0, at);
        return;
    }
    int best = -1;
    uint32_t best_pc = 0;
    for (int u = 0; u < UNITS; u++)
        if (ready(u) && (best < 0 || head(u)->pc < best_pc)) best = u, best_pc = head(u)->pc;
    if (best >= 0) {
        uint32_t op = OPC(&head(best)->ins);
        uint32_t d = run_head(best);
        if (running && !starved()) counter[C_STALL] += d; /* the dispatcher waited meanwhile */
        /* the counters this step changed: the unit's busy cycles, stalls, bytes (a cancellation
           point's marker's are written by the next step that writes them, at WAITING or at the stop) */
        if (running && op != OP_CANCEL_POINT) {
            write_counter(C_BUSY + best);
            write_counter(C_STALL);
            write_counter(C_INSTRET);
            if (best == 0) write_counter(C_RD); /* the load unit */
            if (best == 3) write_counter(C_WR); /* the store unit */
        }
        return;
    }
    if (starved() && queues_empty()) {
        write_counter(C_INSTRET); /* markers run since the last instruction wrote none */
        write_counter(C_STALL);
        MMIO(MMIO_WAIT_TAIL) = tail_seen; /* STATUS reads WAITING until the host rings again */
        REG(R_STATUS) = ST_WAITING;       /* the host appends to the ring (or the timeout comes) */
        return;
    }
    stop(ST_ERROR, E_DEADLOCK, pc); /* nothing can happen any more */
}

int main(void) {
    spad_bytes = CONFIG(CFG_SPAD_BYTES);
    acc_bytes = CONFIG(CFG_ACC_BYTES);
    dram_bytes = CONFIG(CFG_DRAM_BYTES);
    lanes = CONFIG(CFG_LANES);
    acc_row_bytes = CONFIG(CFG_ACC_ROW_BYTES);
    queue_depth = CONFIG(CFG_QUEUE_DEPTH);
    token_depth = CONFIG(CFG_TOKEN_DEPTH);
    if (queue_depth > QMAX) queue_depth = QMAX;
    for (int u = 0; u < UNITS; u++) qrow[u] = queue[u], qend[u] = queue[u] + queue_depth;
    for (;;) {
        uint32_t ev = MMIO(MMIO_EVENTS);
        control(ev);
        if (running) {
            step(ev);
            if (running && !starved() && REG(R_STATUS) == ST_WAITING) REG(R_STATUS) = ST_RUNNING;
        }
    }
}
