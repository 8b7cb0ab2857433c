"""`train.eval_subset`: a full evaluation's `eval/subset/*` figures are those of its first
tasks evaluated alone, so that every point of a run's curve is over one task set."""

import pytest

from tirjax.env.toolworld import Difficulty, make_demos, make_tasks
from tirjax.episodes import RolloutOptions, Shapes
from tirjax.testing.scripted_samplers import ScriptedSampler, distinct_questions
from tirjax.trainer.evaluation import evaluate

OPTIONS = RolloutOptions(max_new_tokens=160, shapes=Shapes(
    num_rows=4, max_steps=10, max_calls=4, max_gt_calls=8, max_tokens=1024, max_params=4))


def test_subset_figures_are_the_first_tasks_alone(tokenizer):
  tasks = distinct_questions(make_tasks("eval", 40, seed=2, difficulty=Difficulty(
      hop_weights=(1, 1, 0, 0), p_down=0.0)), 12)
  # a deterministic policy that answers right on a third of the tasks (by position)
  right = {t.task_id for t in tasks[::3]}
  sampler = ScriptedSampler(tokenizer, tasks, make_demos(tasks, seed=0),
                            answer=lambda t: t.answer if t.task_id in right else "no idea")
  full = evaluate(sampler, tokenizer, tasks, OPTIONS, subset=5)
  alone = evaluate(sampler, tokenizer, tasks[:5], OPTIONS)
  assert full["eval/accuracy"] == pytest.approx(4 / 12)
  assert full["eval/subset/accuracy"] == pytest.approx(alone["eval/accuracy"]) == 2 / 5
  for key, value in alone.items():
    if key.startswith("eval/") and key.count("/") == 1 and not key.startswith("eval/solve"):
      assert full[key.replace("eval/", "eval/subset/")] == pytest.approx(value), key
  assert not any(k.startswith("eval/subset/") for k in alone)
