"""Reports of experiments: learning curves, final-metric tables with confidence intervals,
paired comparisons against a baseline (trainer run directories or credit-bench results).

    from tirjax import reporting
    study = reporting.load(["runs/ablate"])          # or ["benchmarks/results/credit_bench.json"]
    reporting.write_report(study, "report/")         # report.md, summary.csv, paired.csv, PNGs

Modules: `runs` (loading run directories, through `tirjax.rundir.RunDir`), `stats`
(t-intervals, paired t-test), `tables` (Markdown/CSV), `plots` (matplotlib, Agg), `report`
(all of it on disk), `launch` (a training run started from a script), `benchmark` (what
benchmark result files record: the machine, compiled memory).
"""

from tirjax.reporting.report import render_markdown, write_report
from tirjax.reporting.runs import Run, Study, bench_study, load, load_bench, load_run_dirs

__all__ = ["Run", "Study", "bench_study", "load", "load_bench", "load_run_dirs", "render_markdown",
           "write_report"]
