/* Reset entry of the boot loader: a stack at the top of RAM (the firmware's own, not yet in use). */
    .section .text.start
    .global _start
_start:
    la sp, _stack_top
    j boot
