"""The nominal fp32 peak that benchmarks/ensemble_speed.py divides by, from /proc/cpuinfo text."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from ensemble_speed import cpu_fp32_peak


def _cpuinfo(vendor: str, family: int, flags: str, mhz: float = 2600.0) -> str:
    # two logical CPUs, as /proc/cpuinfo lists them; only the first block is read
    block = f"vendor_id\t: {vendor}\ncpu family\t: {family}\ncpu MHz\t\t: {mhz}\nflags\t\t: {flags}\n"
    return block + "\n" + block


@pytest.mark.parametrize(
    ("vendor", "family", "flags", "bits"),
    [
        ("GenuineIntel", 6, "fpu sse2 avx avx2 fma avx512f avx512dq", 512),  # Xeon: two 512-bit FMA units
        ("AuthenticAMD", 25, "fpu sse2 avx avx2 fma avx512f avx512bw", 256),  # Zen 4: AVX-512 on 256-bit units
        ("AuthenticAMD", 26, "fpu sse2 avx avx2 fma avx512f", 512),  # Zen 5: full-width
        ("AuthenticAMD", 23, "fpu sse2 avx avx2 fma", 256),  # Zen 2: AVX2 only
        ("GenuineIntel", 6, "fpu sse2", 128),
    ],
)
def test_peak_counts_the_fma_datapath_width(vendor, family, flags, bits):
    got = cpu_fp32_peak(_cpuinfo(vendor, family, flags), cores=2)
    assert got["fma_datapath_bits"] == bits
    # 2 cores x 2.6 GHz x (bits / 32) lanes x 2 (multiply-add) x 2 FMA units, by hand
    assert got["fp32_peak_gflops_nominal"] == pytest.approx(2 * 2.6 * (bits // 32) * 2 * 2, abs=0.05)
    assert got["vendor"] == vendor and got["cpu_family"] == family


def test_unreadable_clock_gives_no_peak():
    got = cpu_fp32_peak("flags\t: avx2 fma\n", cores=2)
    assert got["isa"] == "avx2+fma" and got["fp32_peak_gflops_nominal"] is None
