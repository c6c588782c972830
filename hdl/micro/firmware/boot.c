/* The boot loader, the only code in block RAM: it copies the firmware from the board's SPI flash
   (FLASH_FIRMWARE: magic, length, word sum, 0, the image) into RAM, checks it and runs it. A soft
   reset, with the firmware loaded and checked since power-up (MMIO_BOOT), runs it at once. A flash
   without the firmware ends as a run that met a bus error: STATUS = ERROR, ERROR_CODE = BUS, the
   interrupt raised, and every START after it taken and ended at once. */
#include <stdint.h>
#include "isa.h"

#define MMIO(off) (*(volatile uint32_t *)(MMIO_BASE + (off)))
#define REG(off) (*(volatile uint32_t *)(REGS_BASE + (off)))
#define CS_N 1
#define SCK 2
#define COPI 4

/* one byte each way, SPI mode 0: the flash samples COPI on SCK's rise, shifts CIPO on its fall */
static uint32_t xfer(uint32_t out) {
    uint32_t in = 0;
    for (int i = 0; i < 8; i++, out <<= 1) {
        uint32_t d = out & 0x80 ? COPI : 0;
        MMIO(MMIO_SPI) = d;
        MMIO(MMIO_SPI) = d | SCK;
        in = in << 1 | (MMIO(MMIO_SPI) & 1);
    }
    return in;
}

static uint32_t word(void) {
    uint32_t w = 0;
    for (int i = 0; i < 32; i += 8) w |= xfer(0) << i;
    return w;
}

__attribute__((noreturn)) void boot(void) {
    if (!(MMIO(MMIO_BOOT) & 1)) {
        MMIO(MMIO_SPI) = CS_N;
        MMIO(MMIO_SPI) = 0;
        xfer(0xAB); /* release from deep power-down (3 us before the next command) */
        MMIO(MMIO_SPI) = CS_N;
        for (volatile int i = 0; i < 16; i++) {}
        MMIO(MMIO_SPI) = 0;
        xfer(0x03); /* READ from FLASH_FIRMWARE */
        xfer(FLASH_FIRMWARE >> 16 & 255);
        xfer(FLASH_FIRMWARE >> 8 & 255);
        xfer(FLASH_FIRMWARE & 255);
        uint32_t magic = word(), len = word(), sum = word();
        word();
        int ok = magic == FIRMWARE_MAGIC && len <= FIRMWARE_LIMIT && !(len & 3);
        uint32_t *ram = (uint32_t *)RAM_BASE;
        for (uint32_t k = 0; ok && k < len / 4; k++) {
            ram[k] = word();
            sum -= ram[k];
        }
        MMIO(MMIO_SPI) = CS_N;
        if (!ok || sum) { /* as a run that stopped on a bus error: every START ends at once */
            REG(R_ERROR_CODE) = E_BUS;
            REG(R_STATUS) = ST_ERROR;
            MMIO(MMIO_EVENTS) = ACT_RAISE_IRQ;
            for (;;) MMIO(MMIO_EVENTS) = ACT_CLEAR_START;
        }
        MMIO(MMIO_BOOT) = 1;
    }
    ((void (*)(void))RAM_BASE)();
    for (;;) {}
}
