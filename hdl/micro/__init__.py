"""The micro core (`core="micro"` configurations, the iCE40 UP5K): the ISA run from firmware on a
small control processor. `core.py` is the hardware, `firmware/` the firmware, `memmap.py` the
contract between them."""
