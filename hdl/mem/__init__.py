"""Memories behind the core's AXI4 DRAM port on boards: SDR SDRAM controller, iCE40 SPRAM adapter."""
