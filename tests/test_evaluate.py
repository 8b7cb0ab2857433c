"""`experiments.evaluate`: a tiny exported policy evaluated on a few tasks of each dataset, with
each paper's metrics, results written once and never overwritten."""

import json
import os
import subprocess
import sys

import pytest

from configs import hidifftir
from tirjax.trainer import policy_eval
from tirjax.env.toolworld import build_tokenizer
from tirjax.trainer.progress import METRIC_LABELS
from tirjax.trainer.tasks import load_tokenizer
from tirjax.models import config as model_config
from tirjax.models.decoder import init
from tirjax.models.hf_io import export_hf
from tirjax.testing.dataset_rows import TOOLHOP_ROW, write_ftrl_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Context per dataset: ToolHop's and FTRL's tool specs make long prompts for this tokenizer.
MAX_TOKENS = {"toolworld": 512, "toolhop": 4096, "ftrl": 8192, "bfcl": 8192}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  root = tmp_path_factory.mktemp("policy")
  tok_dir = build_tokenizer(str(root / "tokenizer"), seed=0)
  model = init(model_config.tiny(vocab_size=len(load_tokenizer(str(tok_dir)))), seed=0)
  return export_hf(model, str(root / "run" / "hf_export"), source_dir=str(tok_dir))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Small ToolHop and FTRL files in the datasets' own formats (the tests' fixtures), so that
  the test does not depend on where the real data lies."""
  root = tmp_path_factory.mktemp("data")
  toolhop = root / "toolhop.jsonl"
  toolhop.write_text("".join(json.dumps(dict(TOOLHOP_ROW, id=f"toolhop-{i:03d}")) + "\n"
                             for i in range(24)))
  ftrl = str(root / "ftrl.parquet")
  write_ftrl_table(ftrl, num_rows=24)
  return {"toolhop": str(toolhop), "ftrl": ftrl}


def config_for(env: str, data=None):
  c = hidifftir.get_config(f"model=tiny,env={env}")
  with c.unlocked():
    if data and env in data:
      c.env.data_path = data[env]
    c.rollout.max_new_tokens = 32
    c.rollout.max_steps = 2
    c.rollout.shapes.max_tokens = MAX_TOKENS[env]
  return c


@pytest.mark.slow
@pytest.mark.parametrize("env, paper_metrics", [
    ("toolworld", ()),
    ("toolhop", ("eval/answer_correctness",)),
    ("ftrl", ("eval/solve_p", "eval/solve_r", "eval/solve_f1")),
    ("bfcl", ("eval/bfcl/overall",))])
def test_each_dataset_gets_its_papers_metrics(policy, data, tmp_path, env, paper_metrics):
  run_dir = os.path.dirname(policy)  # a run directory: its hf_export/ is evaluated
  out = str(tmp_path / "eval")
  config = config_for(env, data)
  if env == "toolworld":  # also sampled: pass@k and what each wrong sample got wrong first
    with config.unlocked():
      config.sampler.eval_samples = 2
  result = policy_eval.evaluate_policy(config, run_dir, out, tasks=2)
  assert result["checkpoint"] == policy and result["tasks"] == 2
  axes = ("eval/accuracy", "eval/avg_steps", "eval/unanswerable_rate", "eval/format_reward")
  assert set(axes + paper_metrics) <= set(result["metrics"])
  assert all(0.0 <= result["metrics"][k] <= 1.0 for k in ("eval/accuracy",) + paper_metrics)
  written = json.load(open(os.path.join(out, "results.json")))
  assert written["metrics"] == result["metrics"] and written["env"] == env
  table = open(os.path.join(out, "results.md")).read()
  assert "| eval accuracy |" in table and all(
      label in table for label, key in METRIC_LABELS if key in paper_metrics)
  if env == "bfcl":  # per category as bfcl-eval reports it, and their mean
    categories = [k for k in result["metrics"] if k.startswith("eval/bfcl/multi_turn_")]
    assert categories and "| BFCL overall accuracy |" in table
    assert result["metrics"]["eval/bfcl/overall"] == pytest.approx(
        sum(result["metrics"][k] for k in categories) / len(categories))
  if env == "toolworld":
    failures = {k: v for k, v in result["metrics"].items() if k.startswith("eval/failure/")}
    assert failures and "| samples failed first by format |" in table
    assert sum(failures.values()) + result["metrics"]["eval/sampled_accuracy"] == pytest.approx(1)
  with pytest.raises(FileExistsError, match="never overwritten"):
    policy_eval.evaluate_policy(config_for(env, data), run_dir, out, tasks=2)


def test_bad_policies_and_splits_are_refused_by_name(tmp_path):
  with pytest.raises(ValueError, match="is not a directory"):
    policy_eval.policy_directory(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="neither a Hugging Face checkpoint directory"):
    policy_eval.policy_directory(str(tmp_path))
  with pytest.raises(ValueError, match="env.name=doors: the doors bandit"):
    policy_eval.evaluate_policy(hidifftir.get_config("model=tiny,env=doors"), str(tmp_path),
                             str(tmp_path / "out"))
  with pytest.raises(ValueError, match="split=all: toolworld draws its tasks"):
    policy_eval.evaluate_policy(hidifftir.get_config("model=tiny"), str(tmp_path),
                             str(tmp_path / "out"), split="all")


def test_command_line_names_a_missing_flag():
  proc = subprocess.run([sys.executable, "-m", "experiments.evaluate",
                         "--config=configs/hidifftir.py:model=tiny"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "--policy" in proc.stderr
