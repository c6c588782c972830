"""Board tops: the core or SoC with board DRAM, the UART bridge of the serial protocol, LEDs and reset."""
