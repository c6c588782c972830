"""The micro core (`core="micro"` configurations, the iCE40 UP5K): the ISA run from firmware on a
small control processor. `core.py` is the hardware, `firmware/` the firmware, `memmap.py` the
contract between them."""

#: cycles per int8 multiply-accumulate of a long MATMUL: the MAC engine's runs (hdl/micro/mac.py; two
#: cycles per four MACs, the SPRAM's one port) and the firmware around each output; measured on the
#: RTL: 9,860 cycles for a 4 x 4 x 1024 MATMUL (29.1 per MAC from firmware alone), and checked by
#: tests/hdl/test_micro_firmware.py: the micro core's peak MAC rate is 1 / this
MATMUL_CYCLES_PER_MAC = 0.602
