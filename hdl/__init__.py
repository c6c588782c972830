"""Amaranth RTL of the NPU core: units, memories, AXI master and AXI4-Lite registers
(docs/isa.md, docs/registers.md)."""
