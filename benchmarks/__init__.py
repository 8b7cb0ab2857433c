"""Benchmarks: each `bench_<name>.py` module, run with `python -m`, measures one part and
writes a result file under `benchmarks/results/` (with the machine it ran on); `gpu/run.sh`
runs them on a GPU."""
