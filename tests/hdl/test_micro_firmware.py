"""The micro core's firmware: the committed image and header are what the sources build."""

import pytest

from npu.hdl.micro import firmware


def test_header_is_generated_from_the_isa():
    assert firmware.HEADER.read_text() == firmware.header(), "run `python -m npu.hdl.micro.firmware`"


def test_committed_images_are_what_the_sources_build(tmp_path):
    pytest.importorskip("ziglang", reason="Zig's C compiler (the dev extra) rebuilds the firmware")
    image, boot = firmware.build(tmp_path / "fw.bin", write_header=False, boot_out=tmp_path / "boot.bin")
    assert image == firmware.IMAGE.read_bytes(), "run `python -m npu.hdl.micro.firmware`"
    assert boot == firmware.BOOT_IMAGE.read_bytes(), "run `python -m npu.hdl.micro.firmware`"


def test_flash_image_carries_what_the_boot_loader_checks():
    import struct

    from npu.hdl.micro import memmap as mm

    img = firmware.flash_image(b"\x01\x00\x00\x00\xff\xff\xff\xff\x07")
    magic, length, total, zero = struct.unpack_from("<4I", img)
    assert (magic, length, zero) == (mm.FIRMWARE_MAGIC, 12, 0)  # padded to whole words
    assert total == (1 + 0xFFFFFFFF + 7) & 0xFFFFFFFF
    assert img[16:] == b"\x01\0\0\0" + b"\xff" * 4 + b"\x07\0\0\0"
    assert len(firmware.IMAGE.read_bytes()) <= mm.FIRMWARE_LIMIT


def test_a_config_the_micro_core_cannot_hold_is_refused():
    from npu.config import get_config
    from npu.hdl.micro.core import MicroCore

    with pytest.raises(ValueError, match="exceed"):
        MicroCore(get_config("icebreaker").replace(spad_bytes=64 * 1024))
    with pytest.raises(ValueError, match="32-bit"):
        MicroCore(get_config("tiny").replace(core="micro"))
    with pytest.raises(ValueError, match="queue_depth=16"):  # the firmware's queues hold 8
        MicroCore(get_config("icebreaker").replace(queue_depth=16))


@pytest.mark.rtl
@pytest.mark.xdist_group("rtl-icebreaker")
def test_the_mac_array_streams_a_word_a_cycle():
    """The MAC rate `npu build` reports for the micro core (hdl/micro/mac.py, MACS_PER_CYCLE: 16 int8
    MACs for each A word) holds on the RTL: two MATMULs that differ only in k (16 x 4 x 512 and
    16 x 4 x 1024, int8) differ by one cycle for each SPRAM word staged or streamed more (within
    5 %), the firmware's work per block and per row being the same in both."""
    from npu.config import ACC_BASE, get_config
    from npu.hdl.micro.mac import MACS_PER_CYCLE
    from npu.isa import make
    from npu.sim.rtl.core import run_rtl
    from npu.sim.rtl.suite import _raw

    cfg = get_config("icebreaker")
    m, n = 16, 4
    progs = [
        _raw(f"k{k}", [make("matmul", a=0, b=16384, c=ACC_BASE, m=m, n=n, k=k, a_stride=1024, b_stride=1024,
                            c_stride=16), make("end")])
        for k in (512, 1024)
    ]  # fmt: skip
    recs = run_rtl(cfg, progs, fast_dram=True, stalls=True)
    assert [r.status for r in recs] == ["DONE", "DONE"]
    extra = recs[1].counters["BUSY_MATRIX"] - recs[0].counters["BUSY_MATRIX"]
    words = (n + m) * 512 // 4  # B's words staged and A's words streamed for k's extra 512
    assert abs(extra / words - 1) < 0.05, (extra, words)
    assert MACS_PER_CYCLE == 4 * n  # each streamed A word: four k positions of the n = 4 columns


@pytest.mark.rtl
@pytest.mark.xdist_group("rtl-icebreaker")
def test_the_boot_loader_runs_the_firmware_from_the_flash():
    """At power-up the firmware is not in RAM (the SPRAMs have no initial contents on the board):
    the boot loader reads it from a model of the SPI flash (`flash_image` at FLASH_FIRMWARE,
    bit-banged through MMIO_SPI), checks it and runs it; the first job, started right after reset,
    then agrees with the golden model, and so do the jobs after it, each after a SOFT_RESET, which
    restarts the loaded firmware without reading the flash again."""
    from npu.config import get_config
    from npu.sim.rtl.core import compare, run_model, run_rtl
    from npu.sim.rtl.suite import directed_jobs

    cfg = get_config("icebreaker")
    jobs = directed_jobs(cfg)[:3]
    jobs[0].max_cycles = 40_000_000  # the boot reads 13 KiB a bit at a time
    recs = run_rtl(cfg, jobs, fast_dram=True, flash_boot=True)
    for job, rec in zip(jobs, recs, strict=True):
        assert rec.status == "DONE", (job.name, rec.status, rec.error_code)
        assert not compare(run_model(cfg, job), rec), job.name


@pytest.mark.rtl
@pytest.mark.xdist_group("rtl-icebreaker")
def test_a_flash_without_a_good_image_is_an_error_not_a_hang():
    """A flash whose image fails the boot loader's check (one word changed: the sum differs) stops
    the core as a bus error would, before any instruction: the START ends at once with STATUS
    ERROR and ERROR_CODE BUS (the interrupt raised), not a run that never ends."""
    from npu.config import get_config
    from npu.hdl.micro.firmware import flash_image
    from npu.isa import ErrorCode
    from npu.sim.rtl.core import run_rtl
    from npu.sim.rtl.suite import directed_jobs

    cfg = get_config("icebreaker")
    image = bytearray(flash_image())
    image[100] ^= 0x10
    job = directed_jobs(cfg)[0]
    job.max_cycles = 40_000_000
    (rec,) = run_rtl(cfg, [job], fast_dram=True, flash_boot=bytes(image))
    assert (rec.status, rec.error_code) == ("ERROR", int(ErrorCode.BUS))
