"""A cocotb bus-functional model of an SDR SDRAM chip (IS42S16160 class) on flattened pins.

`SdramModel` watches the controller's clock and, at every falling edge, samples the pins the
controller registered at the rising edge before: the chip acts on that command at the next rising
edge, which numbers the command (`cycle`). It decodes NOP, ACTIVE, READ, WRITE, PRECHARGE (A10: all
banks), AUTO REFRESH and LOAD MODE, keeps the data in a sparse dict of words (unwritten words read
as `initial_word`, a hash of the address, so a misdirected access shows), drives `dq_i` with a
READ's word for the edge CAS-latency cycles after the command (and a junk word at every other
edge, so a capture at the wrong edge shows), and honours DQM: on writes (masked bytes kept) and on
reads (latency 2: masked bytes come back as junk). Burst length 1 only, which is all the
controller uses. `read_delay` shifts the edge the controller captures the data at relative to
the chip's (the controller's parameter of the same name, see hdl/mem/sdram.py): -1 models a chip
clocked by the inverted controller clock.

It checks the timing against the `SdramTiming` it is given (in cycles of `clock_mhz`):

* tRCD (ACTIVE -> READ/WRITE, same bank), tRP (PRECHARGE -> ACTIVE/REFRESH), tRC (ACTIVE ->
  ACTIVE/REFRESH), tRRD (ACTIVE -> ACTIVE, another bank), tRAS (ACTIVE -> PRECHARGE) and its
  maximum, tWR (WRITE -> PRECHARGE), tRFC (REFRESH -> any command), tMRD (LOAD MODE -> any);
* initialisation: nothing but NOPs for the power-up wait, then PRECHARGE all, at least
  `init_refreshes` REFRESHes, LOAD MODE (burst length 1, the model's CAS latency); no ACTIVE,
  READ or WRITE before it;
* state: READ/WRITE to a bank without an open row, ACTIVE to a bank already open, REFRESH or
  LOAD MODE with a bank open, a WRITE without DQ driven, the controller driving DQ while the chip
  does (bus contention);
* refresh: after initialisation the time between two REFRESHes never exceeds `max_refresh_gap`
  cycles (9 x tREFI by default: JEDEC lets a controller postpone eight refreshes), and at any time
  the REFRESHes issued since initialisation are at least (elapsed / tREFI) - 8 (the average is
  within tREFI). A test can ask for a tighter `max_refresh_gap`.

A violation is a `SdramViolation` with the cycle, the command and the rule; the model collects them
and (with `fail_fast`, the default) raises the first at once, failing the test; `check()` raises
if any were collected.
"""

from __future__ import annotations

import random
from collections import deque

import cocotb
from cocotb.triggers import FallingEdge

from npu.hdl.mem.sdram import (
    CMD_ACTIVE,
    CMD_LOAD_MODE,
    CMD_NOP,
    CMD_PRECHARGE,
    CMD_READ,
    CMD_REFRESH,
    CMD_WRITE,
    SdramGeometry,
    SdramTiming,
)

CMD_NAMES = {
    CMD_NOP: "NOP",
    CMD_ACTIVE: "ACTIVE",
    CMD_READ: "READ",
    CMD_WRITE: "WRITE",
    CMD_PRECHARGE: "PRECHARGE",
    CMD_REFRESH: "REFRESH",
    CMD_LOAD_MODE: "LOAD MODE",
    0b110: "BURST TERMINATE",
}

NEVER = -(10**12)


class SdramViolation(AssertionError):
    def __init__(self, cycle: int, command: str, rule: str, detail: str = ""):
        self.cycle, self.command, self.rule, self.detail = cycle, command, rule, detail
        super().__init__(f"cycle {cycle}: {command}: {rule}" + (f" ({detail})" if detail else ""))


def initial_word(geometry: SdramGeometry, bank: int, row: int, col: int) -> int:
    """The content of a word never written: a hash of its address."""
    w = geometry.join(bank, row, col)
    return ((w * 0x9E3779B1) >> 11) & ((1 << geometry.data_bits) - 1)


class SdramModel:
    """The chip on the pins `<prefix>_*` of `dut` (clk_en, cs_n, ras_n, cas_n, we_n, a, ba, dqm,
    dq_o, dq_oe driven by the controller; dq_i driven here), clocked by `clock`."""

    def __init__(
        self,
        dut,
        clock,
        *,
        timing: SdramTiming,
        clock_mhz: float,
        geometry: SdramGeometry | None = None,
        prefix: str = "sdram",
        read_delay: int = 0,
        max_refresh_gap: int | None = None,
        fail_fast: bool = True,
    ):
        geometry = geometry or SdramGeometry()
        self.clock, self.g, self.timing = clock, geometry, timing
        self.c = c = timing.cycles(clock_mhz)
        self.read_delay = read_delay
        self.max_refresh_gap = max_refresh_gap if max_refresh_gap is not None else 9 * c.refi
        self.fail_fast = fail_fast
        self.pin = {n: getattr(dut, f"{prefix}_{n}") for n in (
            "clk_en", "cs_n", "ras_n", "cas_n", "we_n", "a", "ba", "dqm", "dq_o", "dq_oe", "dq_i"
        )}  # fmt: skip
        self.mem: dict[tuple[int, int, int], int] = {}
        self.violations: list[SdramViolation] = []
        self.cycle = 0
        self.rng = random.Random(1)
        nb = geometry.banks
        self.open_row: list[int | None] = [None] * nb
        self.last_act = [NEVER] * nb
        self.last_pre = [NEVER] * nb
        self.last_write = [NEVER] * nb
        self.last_act_any = NEVER
        self.last_ref = NEVER
        self.last_mrs = NEVER
        self.ref_mark = NEVER  # the last REFRESH after initialisation (or its end)
        self.out: dict[int, int] = {}  # chip edge -> the word the chip outputs for it
        # initialisation: "power" -> "precharged" -> (refreshes) -> "ready"
        self.phase = "power"
        self.init_refs = 0
        self.t_ready: int | None = None
        self.refreshes = 0  # since initialisation
        self.max_gap = 0
        self.commands = {name: 0 for name in CMD_NAMES.values()}
        self.trace: deque[str] = deque(maxlen=24)  # the latest commands, for failure messages
        self._task = None

    # ---- running ----

    def start(self) -> None:
        self._task = cocotb.start_soon(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def check(self) -> None:
        """Raise the first violation collected, if any (and check the refresh interval up to now)."""
        self._check_refresh(self.cycle, final=True)
        for b in range(self.g.banks):
            if self.open_row[b] is not None and self.cycle - self.last_act[b] > self.c.ras_max:
                self._violate("(open row)", "tRAS max", f"bank {b} open since cycle {self.last_act[b]}")
        if self.violations:
            raise self.violations[0]

    def _violate(self, command: str, rule: str, detail: str = "") -> None:
        v = SdramViolation(self.cycle, command, rule, detail)
        v.recent = list(self.trace)
        self.violations.append(v)
        if self.fail_fast:
            raise v

    def _need(self, ok: bool, command: str, rule: str, detail: str = "") -> None:
        if not ok:
            self._violate(command, rule, detail)

    async def _run(self) -> None:
        p = self.pin
        cs_n, ras_n, cas_n, we_n, dq_oe, dq_i = (
            p["cs_n"], p["ras_n"], p["cas_n"], p["we_n"], p["dq_oe"], p["dq_i"]
        )  # fmt: skip
        mask = (1 << self.g.data_bits) - 1
        fe = FallingEdge(self.clock)
        chip_drove = False
        while True:
            await fe
            self.cycle += 1
            k = self.cycle
            # read DQM (latency 2): DQM high at this edge turns the bytes it masks to Hi-Z two edges on
            if k + 2 in self.out:
                dqm = int(p["dqm"].value)
                for i in range(self.g.data_bytes):
                    if dqm >> i & 1:
                        self.out[k + 2] ^= (self.rng.randrange(1, 256)) << (8 * i)  # Hi-Z: junk
            # the word the controller captures at its rising edge k (the chip's k - read_delay)
            word = self.out.pop(k - self.read_delay, None)
            dq_i.value = word if word is not None else (self.rng.getrandbits(16) & mask)
            # the controller drives DQ from rising edge k - 1: the chip must not drive it for edge
            # k, nor still hold it after edge k - 1
            if int(dq_oe.value) and (word is not None or chip_drove):
                self._violate("(bus)", "bus contention", "the controller drives DQ while the chip does")
            chip_drove = word is not None
            if self.t_ready is not None:
                self._check_refresh(k)
            if int(cs_n.value):
                continue
            command = (int(ras_n.value) << 2) | (int(cas_n.value) << 1) | int(we_n.value)
            if command == CMD_NOP:
                continue
            self.apply(k, command)

    # ---- commands ----

    def apply(self, k: int, command: int) -> None:
        """Act on `command` ((ras_n, cas_n, we_n) with cs_n low) at chip edge `k`, the other pins
        as they are now (the clocked loop calls this; tests may call it directly)."""
        c, g, p = self.c, self.g, self.pin
        self.cycle = k
        name = CMD_NAMES[command]
        self.commands[name] += 1
        a = int(p["a"].value)
        bank = int(p["ba"].value)
        self.trace.append(f"{k}:{name} ba={bank} a=0x{a:x}")
        if self.phase == "power" and k <= c.init:
            self._violate(name, "power-up wait", f"{c.init} cycles of NOP first")
        self._need(k - self.last_ref >= c.rfc, name, "tRFC")
        self._need(k - self.last_mrs >= c.mrd, name, "tMRD")
        if command == CMD_ACTIVE:
            self._need(self.phase == "ready", name, "initialisation order", "ACTIVE before LOAD MODE")
            self._need(self.open_row[bank] is None, name, "ACTIVE to an open bank", f"bank {bank}")
            self._need(k - self.last_pre[bank] >= c.rp, name, "tRP", f"bank {bank}")
            self._need(k - self.last_act[bank] >= c.rc, name, "tRC", f"bank {bank}")
            self._need(k - self.last_act_any >= c.rrd, name, "tRRD")
            self.open_row[bank] = a & ((1 << g.row_bits) - 1)
            self.last_act[bank] = self.last_act_any = k
        elif command in (CMD_READ, CMD_WRITE):
            self._need(self.phase == "ready", name, "initialisation order", f"{name} before LOAD MODE")
            row = self.open_row[bank]
            if row is None:
                self._violate(name, "no open row", f"bank {bank}")
                return
            self._need(k - self.last_act[bank] >= c.rcd, name, "tRCD", f"bank {bank}")
            self._need(not (a >> 10) & 1, name, "auto precharge is not modelled")
            col = a & ((1 << g.col_bits) - 1)
            key = (bank, row, col)
            if command == CMD_READ:
                word = self.mem.get(key)
                self.out[k + c.cl] = initial_word(g, *key) if word is None else word
            else:
                self._need(bool(int(p["dq_oe"].value)), name, "WRITE without DQ driven")
                dqm = int(p["dqm"].value)
                data = int(p["dq_o"].value)
                old = self.mem.get(key)
                old = initial_word(g, *key) if old is None else old
                keep = 0
                for i in range(g.data_bytes):
                    if dqm >> i & 1:
                        keep |= 0xFF << (8 * i)
                self.mem[key] = (old & keep) | (data & ~keep & ((1 << g.data_bits) - 1))
                self.last_write[bank] = k
        elif command == CMD_PRECHARGE:
            banks = range(g.banks) if (a >> 10) & 1 else [bank]
            for b in banks:
                if self.open_row[b] is None:
                    continue  # a no-op for an idle bank
                self._need(k - self.last_act[b] >= c.ras, name, "tRAS", f"bank {b}")
                self._need(k - self.last_act[b] <= c.ras_max, name, "tRAS max", f"bank {b}")
                self._need(k - self.last_write[b] >= c.wr, name, "tWR", f"bank {b}")
                self.open_row[b] = None
                self.last_pre[b] = k
            if self.phase == "power" and (a >> 10) & 1:
                self.phase = "precharged"
        elif command == CMD_REFRESH:
            order = self.phase in ("precharged", "ready")
            self._need(order, name, "initialisation order", "REFRESH before PRECHARGE all")
            for b in range(g.banks):
                self._need(self.open_row[b] is None, name, "REFRESH with a bank open", f"bank {b}")
                self._need(k - self.last_pre[b] >= c.rp, name, "tRP", f"bank {b}")
                self._need(k - self.last_act[b] >= c.rc, name, "tRC", f"bank {b}")
            if self.phase == "ready":
                gap = k - self.ref_mark
                self.max_gap = max(self.max_gap, gap)
                detail = f"{gap} cycles since the last one"
                self._need(gap <= self.max_refresh_gap, name, "refresh interval", detail)
                self.refreshes += 1
                self.ref_mark = k
            else:
                self.init_refs += 1
            self.last_ref = k
        elif command == CMD_LOAD_MODE:
            self._need(
                self.phase == "precharged" and self.init_refs >= c.init_refreshes,
                name,
                "initialisation order",
                f"LOAD MODE after PRECHARGE all and {c.init_refreshes} REFRESHes",
            )
            for b in range(g.banks):
                self._need(self.open_row[b] is None, name, "LOAD MODE with a bank open", f"bank {b}")
                self._need(k - self.last_pre[b] >= c.rp, name, "tRP", f"bank {b}")
            self._need(bank == 0 and a & 7 == 0, name, "mode", f"burst length 1 expected, A=0x{a:x}")
            self._need((a >> 4) & 7 == c.cl, name, "mode", f"CAS latency {(a >> 4) & 7}, expected {c.cl}")
            self._need((a >> 7) & 3 == 0, name, "mode", "operating mode must be standard")
            self.last_mrs = k
            if self.phase == "precharged":
                self.phase = "ready"
                self.t_ready = self.ref_mark = k
        else:
            self._violate(name, "unsupported command")

    def _check_refresh(self, k: int, final: bool = False) -> None:
        if self.t_ready is None:
            return
        gap = k - self.ref_mark
        if gap == self.max_refresh_gap + 1 or (final and gap > self.max_refresh_gap):
            self._violate("(refresh)", "refresh interval", f"no REFRESH for {gap} cycles")
        owed = (k - self.t_ready) // self.c.refi - 8
        if self.refreshes < owed and (final or (k - self.t_ready) % self.c.refi == 0):
            self._violate("(refresh)", "refresh average", f"{self.refreshes} REFRESHes, {owed + 8} due")

    # ---- for tests ----

    def refresh_stats(self) -> dict[str, float]:
        """REFRESHes since initialisation, the longest gap and the average interval (cycles)."""
        span = self.cycle - (self.t_ready or 0)
        return {
            "refreshes": self.refreshes,
            "max_gap": self.max_gap,
            "average": span / self.refreshes if self.refreshes else float("inf"),
        }
