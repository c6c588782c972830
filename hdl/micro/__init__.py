"""The micro core (`core="micro"` configurations, the iCE40 UP5K): the ISA run from firmware on a
small control processor. `core.py` is the hardware, `firmware/` the firmware, `memmap.py` the
contract between them."""

#: processor cycles per int8 multiply-accumulate of MATMUL's inner loop (firmware and PcpiMul as
#: they are; measured on the RTL: 476,967 cycles for a 4 x 4 x 1024 MATMUL, 29.1 per MAC (33.1
#: with compressed instructions), and checked by tests/hdl/test_micro_firmware.py): the micro
#: core's peak MAC rate is 1 / this
MATMUL_CYCLES_PER_MAC = 29.1
