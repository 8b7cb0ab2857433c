"""Rollout shapes that fit the data (issue 41): what a split's tasks need, "auto" shapes sized
from it, pinned shapes checked against it, all of them named in one error."""

import importlib
import json

import hypothesis
import hypothesis.strategies as st
import pytest
from absl import flags
from ml_collections import config_flags

from configs import grpo, hidifftir
from tirjax.env.datasets.bfcl import load_bfcl
from tirjax.env.datasets.ftrl import load_ftrl
from tirjax.env.datasets.toolhop import load_toolhop
from tirjax.env.sandbox import Sandbox
from tirjax.env.tools import Dialogue, Task
from tirjax.episodes.options import RolloutOptions, Shapes
from tirjax.testing.dataset_rows import TOOLHOP_ROW, write_ftrl_table
from tirjax.testing import short_runs
from tirjax.testing.short_runs import CONFIGS
from tirjax.trainer import prepare, resolve, shape_needs
from tirjax.trainer.samplers import attention_budget, prefill_rows
from tirjax.trainer.sections import EnvOptions
from tirjax.trainer.shape_needs import AUTO, Need, Needs
from tirjax.trainer.tasks import TaskSource


# -- References, written from the module docstring: plain loops ------------------------------

def reference_needs(tasks, prompt_lengths):
  """{size: (value, first task id with it)} over `tasks`, one loop per size."""
  out = {"prompt_tokens": (1, ""), "gt_calls": (0, ""), "params": (0, ""), "steps": (0, "")}
  if not tasks:
    return out
  for key in out:
    best, who = None, ""
    for task, length in zip(tasks, prompt_lengths):
      calls = [c for step in task.gt_calls for c in step]
      if key == "prompt_tokens":
        value = length
      elif key == "gt_calls":
        value = len(calls)
      elif key == "params":
        value = 0
        for c in calls:
          value = max(value, len(c.get("arguments") or {}))
      else:
        turns = 1 if task.dialogue is None else 1 + len(task.dialogue.user_turns)
        value = len(task.gt_calls) + turns
      if best is None or value > best:
        best, who = value, task.task_id
    out[key] = (best, who)
  return out


def power_of_two_at_least(x):
  p = 1
  while p < x:
    p *= 2
  return p


def as_dict(n: Needs):
  return {k: (getattr(n, k).value, getattr(n, k).task_id)
          for k in ("prompt_tokens", "gt_calls", "params", "steps")}


# -- Random ragged tasks --------------------------------------------------------------------

@st.composite
def tasks_and_prompts(draw):
  n = draw(st.integers(0, 6))
  tasks, lengths = [], []
  for i in range(n):
    steps = draw(st.lists(st.lists(st.integers(0, 9), min_size=0, max_size=4), max_size=5))
    gt = [[{"name": f"t{j}", "arguments": None if a == 0 and draw(st.booleans())
            else {f"k{m}": m for m in range(a)}} for j, a in enumerate(step)] for step in steps]
    turns = draw(st.one_of(st.none(), st.integers(0, 7)))
    dialogue = None if turns is None else Dialogue(
        user_turns=["next"] * turns, max_steps_per_turn=20, decode=list, score=bool)
    tasks.append(Task(task_id=f"task-{i}", question="q", tools=[], answer="a", gt_calls=gt,
                      dialogue=dialogue))
    lengths.append(draw(st.integers(1, 40_000)))
  return tasks, lengths


@hypothesis.given(tasks_and_prompts())
def test_needs_match_a_loop_over_the_tasks(data):
  tasks, lengths = data
  assert as_dict(shape_needs.needs(tasks, lengths)) == reference_needs(tasks, lengths)


@hypothesis.given(tasks_and_prompts(), st.integers(1, 512), st.integers(1, 48),
                  st.sets(st.sampled_from(shape_needs.SIZED)))
def test_auto_shapes_are_the_needs_rounded_up_to_powers_of_two(data, new, max_steps, auto):
  tasks, lengths = data
  n = shape_needs.needs(tasks, lengths)
  ref = reference_needs(tasks, lengths)
  pinned = Shapes(max_steps=max_steps, max_tokens=10**6, max_gt_calls=10**3, max_params=10**3)
  shapes = shape_needs.fit(pinned, auto, n, new, max_steps)
  want = {"max_tokens": power_of_two_at_least(ref["prompt_tokens"][0] + max_steps * new),
          "max_gt_calls": power_of_two_at_least(max(ref["gt_calls"][0], 1)),
          "max_params": power_of_two_at_least(max(ref["params"][0], 1)),
          "max_steps": max_steps}
  for key in shape_needs.SIZED:
    assert getattr(shapes, key) == (want[key] if key in auto else getattr(pinned, key))
  # what auto gives always holds the data and is a valid rollout (room for one step)
  assert shapes.max_tokens >= ref["prompt_tokens"][0] + new
  RolloutOptions(max_steps=max_steps, max_new_tokens=new, shapes=shapes)


@hypothesis.given(tasks_and_prompts(), st.integers(1, 256),
                  st.fixed_dictionaries({k: st.integers(1, 64) for k in
                                         ("max_gt_calls", "max_params")}),
                  st.integers(2, 50_000))
def test_pinned_shapes_too_small_are_all_named_once_with_their_minimum(data, new, pins, tokens):
  tasks, lengths = data
  n = shape_needs.needs(tasks, lengths)
  ref = reference_needs(tasks, lengths)
  shapes = Shapes(max_tokens=tokens, **pins)
  least = {"max_tokens": ref["prompt_tokens"][0] + new, "max_gt_calls": max(ref["gt_calls"][0], 1),
           "max_params": max(ref["params"][0], 1)}
  short = [k for k in ("max_tokens", "max_gt_calls", "max_params") if getattr(shapes, k) < least[k]]
  if not short:
    assert shape_needs.fit(shapes, (), n, new, 6) == shapes
    return
  with pytest.raises(ValueError) as e:
    shape_needs.fit(shapes, (), n, new, 6, split="the eval split")
  message = str(e.value)
  assert message.startswith(f"{short[0]}: the {len(tasks)} tasks of the eval split need ")
  for key in ("max_tokens", "max_gt_calls", "max_params"):
    named = f"{key} >= {least[key]:,} " in message
    assert named == (key in short), (key, message)
  for key in short:  # each with the task that needs it
    who = ref[{"max_tokens": "prompt_tokens", "max_gt_calls": "gt_calls",
               "max_params": "params"}[key]][1]
    assert f"task {who}:" in message


def test_degenerate_splits_and_floors():
  none = shape_needs.needs([], [])
  assert none == Needs.none() and none.tasks == 0
  # no ground truth at all (FTRL): C and P of one, T_max of one step
  task = Task(task_id="ftrl-0", question="q", tools=[], answer=None)
  n = shape_needs.needs([task], [9_471])
  assert (n.gt_calls, n.params, n.steps) == (Need(0, "ftrl-0"), Need(0, "ftrl-0"),
                                             Need(1, "ftrl-0"))
  assert shape_needs.sized(n, 64, 6) == {"max_tokens": 16_384, "max_gt_calls": 1,
                                         "max_params": 1, "max_steps": 6}
  with pytest.raises(ValueError, match="2 lengths for 1 tasks"):
    shape_needs.needs([task], [1, 2])
  with pytest.raises(ValueError, match="num_rows: cannot be 'auto'"):
    shape_needs.fit(Shapes(), ("num_rows",), n, 64, 6)
  # the floors (no task) are valid shapes whatever the raw config holds, and valid rollouts
  for new, steps in ((None, "x"), (-3, 0), (True, 2.5)):
    Shapes(**shape_needs.floors(shape_needs.SIZED, new, steps))
  for new, steps in ((64, 6), (1, 1), (512, 48), (4096, 1)):
    RolloutOptions(max_steps=steps, max_new_tokens=new,
                   shapes=Shapes(**shape_needs.floors(shape_needs.SIZED, new, steps)))


def test_steps_below_the_data_are_a_warning_not_an_error():
  tasks = [Task(task_id="hop7", question="q", tools=[], answer="a",
                gt_calls=[[{"name": "f", "arguments": {"x": 1}}]] * 7)]
  n = shape_needs.needs(tasks, [100])
  assert n.steps == Need(8, "hop7")
  assert shape_needs.short_steps(n, 8) is None
  warning = shape_needs.short_steps(n, 6, "the eval split")
  assert warning.startswith("rollout.max_steps=6: task hop7 of the eval split takes 8 steps")


# -- Configs: the embedded default unchanged; any preset with any env fits -----------------

# The shapes every config had on toolworld with the tiny model before issue 41 (num_rows aside,
# which follows queries_per_step): `make run`'s must not change.
TOOLWORLD_TINY = dict(max_steps=6, max_calls=4, max_gt_calls=8, max_tokens=512, max_params=4)


def test_the_tiny_toolworld_configs_resolve_to_the_shapes_they_had():
  for name in CONFIGS:  # each estimator's config, from its own file or the generic path
    c = short_runs.config(name, "model=tiny")
    before = resolve.resolve(c)
    exp = prepare.experiment(c)  # the data checked: it fits the pinned shapes
    assert exp.rollout.shapes == before.rollout.shapes, name
    assert {k: getattr(exp.rollout.shapes, k) for k in TOOLWORLD_TINY} == TOOLWORLD_TINY, name
    assert exp.auto_shapes == () and before.auto_shapes == ()
    assert resolve.config_record(c)["rollout"]["shapes"]["max_tokens"] == 512


@pytest.fixture(scope="module")
def toolhop_file(tmp_path_factory):
  """A ToolHop file of 30 fixture rows: one with a 5-argument ground-truth call and a long
  question (a long prompt), so that the tiny preset's toolworld shapes could not hold it."""
  path = tmp_path_factory.mktemp("toolhop") / "toolhop.jsonl"
  rows = [dict(TOOLHOP_ROW, id=f"toolhop-{i:03d}") for i in range(30)]
  wide = dict(TOOLHOP_ROW["tools"]["a"], name="five",
              parameters={"type": "object", "properties": {f"p{i}": {"type": "string"}
                                                           for i in range(5)}})
  rows[7] = dict(rows[7], question="Why? " * 400, tools={**TOOLHOP_ROW["tools"], "f": wide},
                 functions=TOOLHOP_ROW["functions"] + ["def five(p0, p1, p2, p3, p4):\n  return 1"],
                 gold_calls=TOOLHOP_ROW["gold_calls"] + ["five('a', 'b', 'c', 'd', 'e')"])
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.fixture(scope="module")
def policy_tokenizer(tokenizer, tmp_path_factory):
  """The directory of the session's toolworld tokenizer (conftest), standing in for a policy's."""
  del tokenizer  # built by the fixture
  return str(tmp_path_factory.getbasetemp() / "toolworld_tokenizer")


def toolhop_config(path, tokenizer_dir, **shapes):
  c = hidifftir.get_config("model=tiny,env=toolhop")
  c.env.data_path, c.model.hf_checkpoint, c.sft.steps = path, tokenizer_dir, 0
  c.rollout.shapes.update(shapes)
  return c


def test_the_tiny_preset_on_toolhop_sizes_its_shapes_from_the_split(toolhop_file,
                                                                     policy_tokenizer):
  c = toolhop_config(toolhop_file, policy_tokenizer)
  assert set(resolve.resolve(c).auto_shapes) == {"max_tokens", "max_gt_calls", "max_params"}
  exp = prepare.experiment(c)
  source_needs = prepare.data_needs(exp.env, exp.seed, c.model.hf_checkpoint, "answer_tag",
                                    (("train", exp.env.train_tasks), ("eval", exp.env.eval_tasks)))
  assert source_needs.params.value == 5 and source_needs.params.task_id == "toolhop-007"
  assert source_needs.prompt_tokens.task_id == "toolhop-007"
  s = exp.rollout.shapes
  assert s.max_params == 8 and s.max_gt_calls == 8  # 5 arguments, 5 calls: the next powers of 2
  assert s.max_tokens == power_of_two_at_least(source_needs.prompt_tokens.value + 6 * 64)
  assert s.max_tokens >= source_needs.prompt_tokens.value + 64 and s.max_steps == 6
  assert exp.auto_shapes == ()
  with pytest.raises(resolve.ConfigError, match="rollout.shapes: max_tokens, max_gt_calls, "
                     "max_params still 'auto'"):
    resolve.fit_to_mesh(resolve.resolve(c), 1, None)


def test_pinned_shapes_that_do_not_fit_fail_once_naming_each(toolhop_file, policy_tokenizer):
  c = toolhop_config(toolhop_file, policy_tokenizer, max_tokens=512, max_params=4,
                     max_gt_calls=8)
  with pytest.raises(resolve.ConfigError) as e:
    prepare.experiment(c)
  message = str(e.value)
  assert message.startswith("rollout.shapes.max_tokens: the 30 tasks of the train and eval "
                            "splits need max_tokens >= ")
  assert "max_params >= 5 (now 4; task toolhop-007: a ground-truth call with 5 arguments)" \
      in message and "max_gt_calls" not in message
  assert message.endswith("set them so, or to 'auto' to size them from the data")


def test_a_shape_is_a_number_or_auto_on_the_command_line_and_nothing_else():
  fv = flags.FlagValues()
  argv = ["x", "--config=configs/grpo.py:model=tiny,env=toolhop",
          "--config.rollout.shapes.max_tokens=8192", "--config.rollout.shapes.max_params=auto"]
  config_flags.DEFINE_config_file("config", None, flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  assert fv.config.rollout.shapes.max_tokens == 8192
  assert fv.config.rollout.shapes.max_params == AUTO
  c = grpo.get_config("model=tiny,env=toolhop")
  c.model.hf_checkpoint, c.env.data_path = ".", __file__
  c.rollout.shapes.max_tokens = "big"
  with pytest.raises(resolve.ConfigError, match=r"rollout\.shapes\.max_tokens: must be an "
                     r"integer >= 1 or 'auto' \(sized from the data\), got 'big'"):
    resolve.resolve(c)
  with pytest.raises(TypeError, match="max_calls"):  # only the sized shapes take "auto"
    c.rollout.shapes.max_calls = AUTO


def test_every_model_preset_with_every_dataset_resolves_before_the_data():
  for name in ("grpo", "hidifftir", "portool"):
    for model in ("tiny", "qwen3_1p7b"):
      for env in ("toolhop", "ftrl", "bfcl"):
        c = importlib.import_module(f"configs.{name}").get_config(f"model={model},env={env}")
        c.model.hf_checkpoint, c.env.data_path, c.sft.steps = ".", __file__, 0
        exp = resolve.resolve(c)  # the shapes left to the data are named
        pinned = {"max_gt_calls", "max_params", "max_tokens"} if env == "bfcl" else set()
        assert set(exp.auto_shapes) & {"max_gt_calls", "max_params", "max_tokens"} == (
            {"max_gt_calls", "max_params", "max_tokens"} - pinned), (name, model, env)


# -- What sizing reads: tasks without their tools defined; what the sampler takes at a size --

def _schema(task):
  unbound = {k: v for k, v in task.metadata.get("load_errors", {}).items()
             if v.startswith("no function source")}  # (not the errors of running the code)
  return (task.task_id, task.question, task.answer, [list(s) for s in task.gt_calls],
          [(t.name, t.description, t.parameters) for t in task.tools], unbound,
          None if task.dialogue is None else list(task.dialogue.user_turns))


def test_tasks_read_without_a_sandbox_are_the_tasks_a_run_gets_less_their_tools(tmp_path):
  toolhop = tmp_path / "toolhop.jsonl"
  # a second tool named `length` and no second source for it: it stays unbound either way
  extra = {"g": {"name": "length", "description": "again", "parameters": {"type": "object"}}}
  row = dict(TOOLHOP_ROW, tools={**TOOLHOP_ROW["tools"], **extra})
  toolhop.write_text(json.dumps(row) + "\n")
  ftrl = str(tmp_path / "ftrl.parquet")
  write_ftrl_table(ftrl, num_rows=3)
  with Sandbox() as sandbox:
    for load in (lambda sb: load_toolhop(str(toolhop), sb), lambda sb: load_ftrl(ftrl, sb),
                 lambda sb: load_bfcl(sb, limit=2)):
      run, schema_only = load(sandbox), load(None)
      assert [_schema(t) for t in schema_only] == [_schema(t) for t in run]
      assert all(t.fn is None for task in schema_only for t in task.tools)
      assert all(task.session is None for task in schema_only)
      assert any(t.fn is not None or task.session is not None for task in run for t in task.tools)


def test_rows_per_prefill_call_hold_its_attention_scores_in_the_budget():
  gib = 1 << 30
  for heads in (1, 4, 16):
    for prompt in (64, 512, 4096, 8192, 16384, 32768):
      for budget in (gib // 4, gib, 3 * gib, 80 * gib):
        rows = prefill_rows(heads, prompt, budget)
        per_row = 4 * heads * prompt * prompt
        assert rows >= 1 and rows & (rows - 1) == 0  # a power of two
        assert rows == 1 or rows * per_row <= budget < 2 * rows * per_row
  assert prefill_rows(4, 512, 3 * gib) >= 256  # `make run`'s: its 256 rows a call unchanged
  assert prefill_rows(4, 8192, 3 * gib) == 2
  assert attention_budget() > 0


def test_a_source_defines_the_tool_code_of_the_tasks_asked_for_each_once(tmp_path, monkeypatch):
  path = str(tmp_path / "ftrl.parquet")
  write_ftrl_table(path, num_rows=24)  # two tools a row, both with code
  defined = []
  real = Sandbox.define

  def define(self, ns, *args, **kwargs):
    defined.append(ns)
    return real(self, ns, *args, **kwargs)
  monkeypatch.setattr(Sandbox, "define", define)
  env = EnvOptions(name="ftrl", data_path=path)
  source = TaskSource(env, seed=0)
  try:
    one = source.tasks("eval", 1)
    assert len(defined) == 2 and all(t.fn is not None for t in one[0].tools)
    three = source.tasks("eval", 3)
    assert three[0] is one[0] and len(defined) == 2 * 3 and len(set(defined)) == len(defined)
    train = source.tasks("train", 2)
    assert len(defined) == 2 * 5 and {t.task_id for t in train}.isdisjoint(
        t.task_id for t in three)
  finally:
    source.close()
  schema = TaskSource(env, seed=0, run_tools=False)
  assert [_schema(t) for t in schema.tasks("eval", 3)] == [_schema(t) for t in three]
  assert len(defined) == 2 * 5  # nothing defined without tools
