"""What a result file records of its machine: the CPU beyond its model name (one model name,
"AMD EPYC", covers CPUs whose XLA code and SFT accuracy differ)."""

from tirjax.reporting import benchmark

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 sha_ni

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
flags\t\t: fpu avx amx_tile
"""


def test_cpu_id_reads_the_first_processor():
  assert benchmark.cpu_id(CPUINFO) == {"vendor": "AuthenticAMD", "family": "26", "model": "2",
                                       "stepping": "1",
                                       "isa": ["avx", "avx2", "fma", "avx512f", "avx512_bf16"]}


def test_machine_records_the_cpu_id():
  info = benchmark.machine(jax_info=False)
  assert info["cpu_id"] == benchmark.cpu_id()
  assert set(info) >= {"cpu", "cpus", "load_average_start"}
