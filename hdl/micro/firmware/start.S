/* Firmware entry (the boot loader jumps here): stack, .bss cleared, then main(). */
    .section .text.start
    .global _start
_start:
    la sp, _stack_top
    la a1, _bss
    la a2, _ebss
1:  bgeu a1, a2, 2f
    sw zero, 0(a1)
    addi a1, a1, 4
    j 1b
2:  call main
3:  j 3b
