"""benchmarks/gpu/run.sh (issue 19) in its --dry-run mode: every section runs on the CPU at
tiny sizes and lands in gpu.json, so that the script is known to work before a GPU session."""

import json
import os
import subprocess
import sys

import pytest
from absl.testing import flagsaver

from tirjax import advantages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
import summarize  # noqa: E402


@pytest.mark.slow
def test_dry_run_writes_every_section(tmp_path):
  out = tmp_path / "gpu"
  proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu", "run.sh"), "--dry-run",
                         f"--out={out}"], capture_output=True, text=True,
                        env={**os.environ, "PYTHON": sys.executable}, timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.load(open(out / "gpu.json"))
  assert result["dry_run"] is True
  assert {k: v["state"] for k, v in result["status"].items()} == dict.fromkeys(
      summarize.SECTIONS, "ok")
  sections = result["sections"]
  [train] = sections["train_step"]["results"]
  assert train["timed"] and train["rows"] >= 2  # the search went past its two probes
  assert train["memory"]["peak_bytes_per_device"] <= train["budget_bytes_per_device"]
  names = {r["name"] for r in sections["kernels"]["records"]}
  assert set(advantages.names()) | {"assignment_hungarian", "assignment_greedy",
                                    "assignment_sinkhorn"} <= names
  assert set(sections["logprobs"]["results"]) == {"logprobs", "logprobs_grad"}
  assert [r["batch"] for r in sections["sampler"]["sections"]["jax"]["throughput"]] == [2, 4]
  update = sections["update"]["cases"]["synthetic"]
  assert update["first_update_loss_rel_diff"] < 1e-5  # padded and packed: the same loss
  assert "target every kernel faster" in proc.stdout


def test_summary_reports_a_missing_section_as_not_run_never_as_a_pass(tmp_path):
  with open(tmp_path / "logprobs.json", "w") as f:
    json.dump({"results": {"logprobs": {"memory": {"ratio": 0.2}, "time": {"ratio": 1.0}}}}, f)
  with flagsaver.flagsaver(dry_run=True):
    assert summarize.main(["summarize", str(tmp_path), "logprobs=ok:3",
                           "train_step=failed(124):270"]) == 1
  result = json.load(open(tmp_path / "gpu.json"))
  verdicts = {t["target"]: t["holds"] for t in result["targets"]}
  assert verdicts["MFU >= 0.40, qwen3_1p7b train step"] is None
  assert verdicts["logprobs: chunked memory <= 0.25x naive"] is True
  assert verdicts["every kernel faster than its CPU reference"] is None
  assert [v for k, v in verdicts.items() if k.startswith("shared/packed update")] == [None]
  assert result["status"]["train_step"] == {"state": "failed(124)", "seconds": "270"}
