/* Shared declarations of the micro core's firmware: the ISA in software on PicoRV32. */
#pragma once
#include <stdint.h>
#include "isa.h"

#define REG(off) (*(volatile uint32_t *)(REGS_BASE + (off)))
#define MMIO(off) (*(volatile uint32_t *)(MMIO_BASE + (off)))
#define CONFIG(k) (*(volatile uint32_t *)(MMIO_BASE + MMIO_CONFIG + 4 * (k)))
#define ONCHIP ((volatile uint8_t *)ONCHIP_BASE)
#define DRAM ((volatile uint8_t *)DRAM_BASE)

/* an instruction word, and the instruction decoded: its fields in format order (sign-extended) */
typedef struct { uint32_t w[8]; } raw_t;
typedef struct { raw_t raw; int32_t f[MAXF]; } instr_t;

/* U(F_LOAD_SPAD): a field as unsigned, S(SF_VMAP_MULT): a signed field */
#define U(k) ((uint32_t)ins->f[k])
#define S(k) (ins->f[k])
#define OPC(ins) ((ins)->raw.w[0] & 15)
#define WAIT(ins) (((ins)->raw.w[0] >> 4) & 15)
#define SIGNAL(ins) (((ins)->raw.w[0] >> 8) & 15)

/* fill ins->f from ins->raw (the opcode must be legal) */
void decode(instr_t *ins);

/* the engine's configuration, read from the hardware at boot */
extern uint32_t spad_bytes, acc_bytes, dram_bytes, lanes, acc_row_bytes, queue_depth, token_depth;

/* the memory window of the run, latched at START: [win_lo, win_hi); PROTECTION's address */
extern uint32_t win_lo, fault_addr;
extern uint64_t win_hi;

/* the unit an instruction runs in (-1: a control instruction) */
int unit_of(const instr_t *ins);
/* decode checks and validation (npu.isa.decode + validate): 0 or the error code */
int check(instr_t *ins);
/* run one unit instruction's data effect (sim/golden/kernels.py) */
void execute(const instr_t *ins);
