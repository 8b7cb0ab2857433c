"""One-off studies: each module, run with `python -m`, answers one question and writes its
result file under `benchmarks/results/`; docs/results.md says which."""
