"""The golden model: the NPU's bit-exact executor with cycle-approximate timing (a core, and engines
sharing DRAM), the program runner and the bank-conflict model. Imports only the contracts (`npu`)."""
