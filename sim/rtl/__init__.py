"""The verification harness: cocotb benches and Verilator builds of the RTL, the RTL-vs-model
differential suite and its random programs, ring scenarios, the board's bus-functional models, the
driver's RTL transport and the RTL benches."""
