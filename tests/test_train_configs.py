"""Experiment configs: every estimator's config loads, is locked, and is checked before compute."""

import dataclasses
import importlib
import re

import pytest

from tirjax import advantages
from tirjax.env.toolworld.demos import DemoOptions
from tirjax.env.toolworld.tasks import Difficulty
from configs import estimator
from tirjax.testing import short_runs
from tirjax.testing.short_runs import CONFIGS
from tirjax.trainer import resolve, sections
from tirjax.train_steps.optimizer import OptimizerOptions
from tirjax.train_steps.sft import SFTLossOptions


def load(name, arg="model=tiny"):
  return short_runs.config(name, arg)


def test_one_config_per_registered_estimator():
  """Every registered estimator has a config (its own file or configs/estimator.py's generic
  path), and every estimator config file is a registered estimator's, giving the same config
  by either path."""
  assert set(CONFIGS) == set(advantages.names())  # ppo and turn_ppo with the trainer's critic
  assert set(short_runs.CONFIG_FILES) <= set(advantages.names())
  for name in short_runs.CONFIG_FILES:
    own = importlib.import_module(f"configs.{name}").get_config("model=tiny")
    assert own.to_dict() == load(name).to_dict(), name


def test_the_generic_config_names_its_argument_s_fault():
  with pytest.raises(ValueError, match="starts with a registered estimator's name"):
    short_runs.config("nosuch", "model=tiny")
  with pytest.raises(ValueError, match="got None"):
    estimator.get_config(None)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_resolves(name):
  c = load(name)
  exp = resolve.resolve(c)
  assert exp.estimator.name == c.advantage.name == name
  assert c.rollout.shapes.num_rows >= c.train.queries_per_step * exp.rollout.rows_per_query


def test_paper_defaults():
  portool = resolve.resolve(load("portool"))
  assert portool.rollout.mode == "tree" and portool.rollout.n == 6  # tiny: 6 rows a query
  assert portool.rollout.tree.branch_factor == 2 and portool.rollout.max_steps == 6
  assert portool.loss.kl_coef == 0 and portool.advantage.gamma == 0.95
  hidiff = resolve.resolve(load("hidifftir"))
  assert hidiff.rollout.n == 6 and hidiff.rollout.max_steps == 6  # tiny: short toolworld
  assert load("hidifftir", "model=qwen3_1p7b").rollout.max_steps == 10  # the paper's
  assert hidiff.loss.kl_coef == 0.001 and hidiff.loss.kl_estimator == "k3"
  assert hidiff.loss.entropy_coef == 0.001 and hidiff.advantage.alpha == 0.7
  dapo = resolve.resolve(load("dapo"))
  assert (dapo.loss.clip_low, dapo.loss.clip_high, dapo.loss.aggregation) == (
      0.2, 0.28, "token_mean")
  arpo = resolve.resolve(load("arpo"))
  assert arpo.rollout.mode == "arpo" and arpo.rollout.arpo.total_rollouts == 16
  # Updates per rollout batch (spec §5.1): HiDiffTIR's 256 queries in mini-batches of 32;
  # PORTool states none, verl's default makes 4 updates a batch.
  def paper_scale(name):
    c = load(name, "model=qwen3_1p7b")
    c.model.hf_checkpoint = "."  # a real preset needs a checkpoint directory
    return resolve.resolve(c)
  paper = paper_scale("hidifftir")
  assert (paper.train.queries_per_step, paper.train.mini_batch_queries) == (256, 32)
  assert paper.train.num_minibatches == 8 and paper.train.ppo_epochs == 1
  assert paper.rollout.n == 16 and paper.rollout.temperature == 1.0
  assert paper_scale("portool").train.num_minibatches == 4
  assert paper_scale("portool").rollout.n == 8
  # tiny (issue 26): 8 queries x 6 rows at T = 0.6 on the tempered policy, 4 updates a batch
  assert (hidiff.train.queries_per_step, hidiff.train.num_minibatches) == (8, 4)
  assert hidiff.rollout.temperature == 0.6 and hidiff.train.tempered_policy


def test_rows_follow_queries_per_step():
  c = load("grpo")
  c.train.queries_per_step = 3
  assert c.rollout.shapes.num_rows == 3 * c.rollout.n


def test_mistyped_key_fails_naming_it():
  c = load("portool")
  with pytest.raises(AttributeError, match="fork_scal"):
    c.advantage.options.fork_scal = "none"
  with pytest.raises(ValueError, match="unknown preset key 'modle'"):
    load("portool", "modle=tiny")
  with pytest.raises(ValueError, match="model=giant"):
    load("portool", "model=giant")


@pytest.mark.parametrize("key, value, message", [
    ("advantage.options.fork_scale", "sometimes", r"advantage\.options: fork_scale"),
    ("loss.clip_low", 1.5, r"loss: clip_low"),
    ("rollout.temperature", -1.0, r"rollout: temperature: must be >= 0"),
    ("train.queries_per_step", 0, r"train\.queries_per_step"),
    ("optim.learning_rate", -1.0, r"optim: learning_rate"),
    ("env.name", "atlantis", r"env\.name"),
    ("model.tiny.num_layers", 0, r"model\.tiny\.num_layers"),
    ("sampler.kind", "magic", r"sampler\.kind"),
])
def test_out_of_range_value_fails_naming_the_key(key, value, message):
  c = load("portool")
  section, _, leaf = key.rpartition(".")
  node = c
  for part in section.split("."):
    node = node[part]
  node[leaf] = value
  with pytest.raises(resolve.ConfigError, match=message):
    resolve.resolve(c)


def test_vllm_refuses_a_tiny_head_size_it_cannot_serve():
  c = load("grpo", "model=tiny,sampler=vllm")
  resolve.resolve(c)  # head size 32 by default
  c.model.tiny.head_dim = 16
  with pytest.raises(resolve.ConfigError, match=r"model\.tiny\.head_dim: vLLM's CPU attention"):
    resolve.resolve(c)


def test_real_presets_need_a_checkpoint():
  with pytest.raises(resolve.ConfigError, match="model.hf_checkpoint"):
    resolve.resolve(load("grpo", "model=qwen3_0p6b"))
  c = load("grpo", "env=toolhop")
  c.env.data_path = __file__  # exists wherever the repository is cloned
  c.sft.steps = 5
  c.model.hf_checkpoint = "."
  with pytest.raises(resolve.ConfigError, match="sft.steps"):
    resolve.resolve(c)


def test_mesh_preset():
  c = load("grpo", "model=tiny,mesh=-1x2x1")
  assert tuple(map(tuple, c.sharding.mesh)) == (("data", -1), ("fsdp", 2), ("tensor", 1))
  with pytest.raises(ValueError, match="mesh=2x2"):
    load("grpo", "mesh=2x2")


def test_steps_preset_names_itself_when_it_is_not_an_integer():
  assert load("grpo", "steps=7").train.steps == 7
  with pytest.raises(ValueError, match="steps=abc: the preset 'steps' must be an integer"):
    load("grpo", "model=tiny,steps=abc")


@pytest.mark.parametrize("name, base_key, value, derived", [
    ("dapo", "rollout.max_new_tokens", 100, {"advantage.options.max_response_tokens": 6 * 100,
                                             "advantage.options.overlong_cache": 120}),
    ("dapo", "rollout.max_steps", 3, {"advantage.options.max_response_tokens": 3 * 64,
                                      "advantage.options.overlong_cache": 3 * 64 // 5}),
    ("dr_grpo", "rollout.max_new_tokens", 100, {"loss.norm_constant": 600.0}),
    ("dr_grpo", "rollout.max_steps", 2, {"loss.norm_constant": 128.0}),
    ("grpo", "train.queries_per_step", 6, {"rollout.shapes.num_rows": 6 * 6}),
    ("grpo", "rollout.n", 4, {"rollout.shapes.num_rows": 8 * 4}),
    ("hidifftir", "rollout.max_steps", 4, {"rollout.shapes.max_steps": 4}),
    ("hidifftir", "sft.steps", 300, {"sft.optim.decay_steps": 300}),
])
def test_values_derived_from_an_overridden_key_follow_it(name, base_key, value, derived):
  """Issue 16: derived values are live references, never frozen in get_config."""
  c = load(name)
  node = c
  *path, leaf = base_key.split(".")
  for part in path:
    node = node[part]
  node[leaf] = value
  for key, want in derived.items():
    got = c
    for part in key.split("."):
      got = got[part]
    assert got == want, key
  resolve.resolve(c)  # and the result is a valid config


@pytest.mark.parametrize("derived_key, base_key", [
    ("sft.optim.decay_steps", "sft.steps"), ("rollout.shapes.max_steps", "rollout.max_steps"),
    ("rollout.shapes.num_rows", "train.queries_per_step")])
def test_overriding_a_derived_value_leaves_its_source_alone(derived_key, base_key):
  """A derived key set on the command line replaces the link; a shared reference would have
  changed its source as well (ml_collections sets a referenced value through any alias)."""
  c = load("hidifftir")

  def get(key):
    node = c
    for part in key.split("."):
      node = node[part]
    return node

  before = get(base_key)
  *path, leaf = derived_key.split(".")
  node = c
  for part in path:
    node = node[part]
  node[leaf] = 96
  assert get(derived_key) == 96 and get(base_key) == before


@pytest.mark.parametrize("key, value", [
    ("env.toolworld.p_down", 1.5), ("env.toolworld.p_parallel", -0.1),
    ("env.toolworld.hop_weights", (1.0, 1.0)),
    ("env.toolworld.hop_weights", (0.0, 0.0, 0.0, 0.0)), ("model.tiny.num_kv_heads", 3),
    ("seed", -1),
    ("sharding.mesh", (("data", 3), ("fsdp", 1), ("tensor", 1))),
    ("env.train_tasks", 10**9), ("sft.hop_weights", (1.0,))])
def test_bad_values_fail_before_the_workdir_is_touched(tmp_path, key, value):
  """Issue 14: each of these failed only after config.json was written (and the corrected
  rerun was then refused); now the check comes first and names the key."""
  from tirjax.trainer.train import run  # noqa: PLC0415
  c = load("grpo")
  node = c
  *path, leaf = key.split(".")
  for part in path:
    node = node[part]
  node[leaf] = value
  workdir = tmp_path / "run"
  with pytest.raises(resolve.ConfigError, match=key.split(".")[0]):
    run(c, str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize("arg", ["model=tiny", "model=qwen3_0p6b,env=bfcl", "env=doors"])
def test_every_section_resolves_to_its_typed_options(arg):
  """Issue 16: one typed config surface. The experiment's own sections are generated from
  their options dataclasses (the same keys) and come back from `resolve` as those objects."""
  c = load("hidifftir", arg)
  with c.unlocked():
    c.model.hf_checkpoint = c.model.hf_checkpoint or (
        "." if "qwen" in arg else "")  # a real preset needs a checkpoint directory
  exp = resolve.resolve(c)
  own = sections.env_sections()  # env.<name>: each environment's own section
  assert own == {"toolworld": Difficulty}
  # One list of every section (issue 57): the config's keys are `seed` and these.
  assert set(c.keys()) == {"seed", *sections.SECTIONS}
  for name, cls in sections.SECTIONS.items():
    derived = set(sections.DERIVED.get(name, ()))
    extra = set(own) if name == "env" else set()
    assert set(c[name].keys()) == {f.name for f in dataclasses.fields(cls)} - derived | extra
    if name == "advantage":  # the estimator's own options class
      assert isinstance(exp.advantage, exp.estimator.options) and exp.estimator.name == c[
          name].name
      continue
    assert isinstance(getattr(exp, name), cls), name
  for env_name, cls in own.items():
    assert set(c.env[env_name].keys()) == {f.name for f in dataclasses.fields(cls)}
  assert exp.env.options == (Difficulty(**c.env.toolworld.to_dict() | dict(
      hop_weights=tuple(c.env.toolworld.hop_weights))) if exp.env.name == "toolworld" else None)
  # The SFT section's subsections are its options' (the answer protocol is the rollout's).
  for sub, cls in (("optim", OptimizerOptions), ("loss", SFTLossOptions), ("demos", DemoOptions)):
    assert set(c.sft[sub].keys()) == {f.name for f in dataclasses.fields(cls)} - {
        "answer_protocol"}, sub
    assert isinstance(getattr(exp.sft, sub), cls), sub
  assert exp.sft.demos.answer_protocol == exp.rollout.answer_protocol
  assert exp.train.queries_per_step == c.train.queries_per_step
  assert exp.seed == c.seed


def test_the_rollouts_seed_is_the_runs_seed():
  """Issue 39: `rollout.seed` was a key nothing read (the trainer draws from one Generator of
  `seed`); it is derived now, so there is one seed to set."""
  c = load("grpo")
  assert "seed" not in c.rollout
  with c.unlocked():
    c.seed = 7
  assert resolve.resolve(c).rollout.seed == 7


@pytest.mark.parametrize("key, value, message", [
    ("judge.kind", "oracle", r"judge\.kind: must be one of"),
    ("judge.votes", 0, r"judge\.base_url"),  # llm needs an endpoint first
    ("sft.num_demos", 0, r"sft\.num_demos: must be an integer >= 1"),
    ("train.checkpoint_every", 0, r"train\.checkpoint_every: must be an integer >= 1"),
    ("sampler.eval_temperature", -0.5, r"sampler\.eval_temperature: must be >= 0"),
    ("step.logprob_chunk_size", 0, r"step\.logprob_chunk_size: must be an integer >= 1"),
    ("step.num_microbatches", 0, r"step\.num_microbatches: must be an integer >= 1"),
    ("step.max_tokens_per_microbatch", 0,
     r"step\.max_tokens_per_microbatch: must be an integer >= 1"),
    ("step.attention_block", 0, r"step\.attention_block: must be an integer >= 1"),
    ("sft.max_tokens_per_microbatch", 0,
     r"sft\.max_tokens_per_microbatch: must be an integer >= 1"),
    ("step.bucket_steps", 0, r"step\.bucket_steps: must be an integer >= 1"),
    ("judge.abstention", "free", r"judge\.abstention: must be one of"),
    ("sampler.eval_samples", -1, r"sampler\.eval_samples: must be an integer >= 0"),
    ("train.ppo_epochs", 0, r"train\.ppo_epochs: must be an integer >= 1"),
    ("train.mini_batch_queries", 3, r"train\.mini_batch_queries: 3 does not divide "
                                    r"queries_per_step=8"),
    ("env.toolworld.p_direction", 1.5, r"env\.toolworld\.p_direction: must lie in \[0, 1\]"),
])
def test_own_sections_name_the_bad_key(key, value, message):
  c = load("grpo")
  *path, leaf = key.split(".")
  with c.unlocked():
    if key == "judge.votes":
      c.judge.kind = "llm"
    node = c
    for part in path:
      node = node[part]
    node[leaf] = value
  with pytest.raises(resolve.ConfigError, match=message):
    resolve.resolve(c)


@pytest.mark.parametrize("name", ["grpo", "hidifftir", "portool"])
def test_rl_and_sft_packed_by_default_sft_at_its_own_budget(name):
  exp = resolve.resolve(load(name, "model=tiny"))
  assert exp.step.packed and exp.sft.step.packed
  assert exp.sft.step.max_tokens_per_microbatch == 1024
  assert exp.step.max_tokens_per_microbatch == 16384
  c = load(name, "model=tiny")
  c.step.packed = False  # the padded path stays an option, for both
  c.sft.max_tokens_per_microbatch = 512
  exp = resolve.resolve(c)
  assert not exp.step.packed and not exp.sft.step.packed
  assert exp.sft.step.max_tokens_per_microbatch == 512


def test_tempered_policy_sets_the_step_temperature():
  c = load("hidifftir")
  c.rollout.temperature = 0.7
  c.train.tempered_policy = False
  assert resolve.resolve(c).step.temperature == 1.0  # the raw model
  c.train.tempered_policy = True
  exp = resolve.resolve(c)
  assert exp.step.temperature == 0.7 and exp.sft.step.temperature == 1.0
  c.rollout.temperature = 0.0
  with pytest.raises(resolve.ConfigError, match=r"train\.tempered_policy: needs a sampling"):
    resolve.resolve(c)


def test_an_estimator_that_needs_a_rollout_field_requires_its_rollout_option():
  """remax reads Rollouts.greedy_outcome: without the greedy rollout it is refused up front."""
  c = load("remax")
  assert resolve.resolve(c).rollout.greedy_baseline
  c.rollout.greedy_baseline = False
  with pytest.raises(resolve.ConfigError, match=r"rollout\.greedy_baseline: advantage remax"):
    resolve.resolve(c)


@pytest.mark.parametrize("old", ["train.micro_batches", "model.logprob_chunk",
                                 "train.log_entropy", "sft.p_confuse", "rollout.seed"])
def test_a_renamed_or_removed_key_is_refused_by_name(old):
  """The old names of keys moved in issue 29, and `rollout.seed`, are gone (issue 39): the
  locked config refuses them on the command line, naming the key, before any compute
  (`tirjax.cli.parse_flags` turns the refusal into one line)."""
  from absl import flags  # noqa: PLC0415
  from ml_collections import config_flags  # noqa: PLC0415
  argv = ["train", "--config=configs/grpo.py:model=tiny", f"--config.{old}=1"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  with pytest.raises((AttributeError, KeyError), match=re.escape(old.rpartition(".")[2])):
    values(argv)


def test_micro_batches_without_sft_need_no_sft_batch_to_divide():
  """A run without SFT steps never builds an SFT batch, so its size is not checked against
  the micro-batches (it was, and `step.num_microbatches > 1` with `sft.steps = 0` failed on an
  SFT batch that does not exist); with SFT steps it still is, naming the key."""
  from tirjax.trainer import parts  # noqa: PLC0415
  c = load("hidifftir")
  c.sft.steps, c.sft.batch_size, c.step.num_microbatches = 0, 3, 2
  _, exp = parts.mesh(resolve.resolve(c))
  per_pass = exp.step.num_microbatches * exp.train.num_minibatches
  assert exp.rollout.shapes.num_rows % per_pass == 0
  c.sft.steps = 5
  with pytest.raises(resolve.ConfigError, match=r"sft\.batch_size: .*multiple"):
    parts.mesh(resolve.resolve(c))
