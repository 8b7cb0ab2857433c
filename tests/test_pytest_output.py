"""pytest's closing counts and slowest durations, read back (benchmarks/bench_test_suite.py)."""

from tirjax.reporting.pytest_output import parse

OUTPUT = """\
........ [100%]
============================= slowest 3 durations =============================
153.52s setup    tests/test_packed_processes.py::test_packed[1]@multiprocess
126.41s call     tests/test_multiprocess.py::test_two_processes_resume_after_a_kill@multiprocess
0.50s teardown tests/test_docs.py::test_x
=========================== short test summary info ============================
FAILED tests/test_a.py::test_b - AssertionError
1 failed, 1801 passed, 12 warnings in 1493.38s (0:24:53)
"""


def test_counts_and_slowest_tests_are_read():
  result = parse(OUTPUT)
  assert result["counts"] == {"failed": 1, "passed": 1801, "warnings": 12}
  assert [(r["seconds"], r["phase"]) for r in result["slowest"]] == [
      (153.52, "setup"), (126.41, "call"), (0.5, "teardown")]
  assert result["slowest"][1]["test"].startswith("tests/test_multiprocess.py::")


def test_no_closing_line_gives_no_counts():
  assert parse("collected 0 items\n") == {"counts": {}, "slowest": []}
