"""The experiment's own option dataclasses: the sections model, env, judge, sampler, train, sft.

Each is a frozen dataclass whose defaults are the base config's and whose `__post_init__`
rejects a bad value naming the key; fields with a fixed set of values are typed `Literal[...]`
(checked by `option_checks.typed_choices`). Every field carries a comment that says what it
is: `--print_config` shows its first sentence beside the key (`tirjax.trainer.sections`, which
lists these with every other section).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal, Mapping, Optional, get_args

from tirjax import option_checks as checks, rundir
from tirjax.env import environments
from tirjax.env.judge import ABSTENTION_RULES
from tirjax.env.toolworld.demos import DemoOptions
from tirjax.train_steps.optimizer import OptimizerOptions
from tirjax.train_steps.sft import SFTLossOptions
from tirjax.train_steps.step import StepOptions

MAX_TASKS = 200_000  # tasks or demonstrations a run may ask for
Sampler = Literal["jax", "vllm"]
Judge = Literal["rule", "llm"]
Abstention = Literal["earned", "claimed"]
VllmDtype = Literal["", "float32", "bfloat16"]
SAMPLERS = get_args(Sampler)
JUDGES = get_args(Judge)
assert get_args(Abstention) == ABSTENTION_RULES


_LIMIT_WHY = ("toolworld draws about 2,000 tasks a second, so larger lists take minutes before "
              "anything else happens")


def _within_limit(name: str, value) -> None:
  checks.at_most(name, value, MAX_TASKS, why=_LIMIT_WHY)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  preset: str = "tiny"  # the policy's architecture and size (`tirjax.models.config.PRESETS`)
  hf_checkpoint: str = ""  # a local HF directory (weights + tokenizer); needed by real presets
  # The tiny model's sizes (`tirjax.models.config.tiny` keyword arguments).
  tiny: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    from tirjax.models.config import PRESETS  # pylint: disable=import-outside-toplevel
    if self.preset not in PRESETS:
      raise ValueError(f"preset: unknown preset {self.preset!r}; valid presets are "
                       f"{sorted(PRESETS)}")
    if self.hf_checkpoint and not os.path.isdir(self.hf_checkpoint):
      raise ValueError(f"hf_checkpoint: {self.hf_checkpoint!r} is not a directory")
    for key, value in dict(self.tiny).items():
      checks.int_at_least(f"tiny.{key}", value, 1)


@dataclasses.dataclass(frozen=True)
class EnvOptions:
  name: str = environments.DEFAULT  # the environment (`tirjax.env.environments.names()`)
  data_path: str = ""  # the dataset file (ToolHop, FTRL); "" = built in or bfcl-eval's own
  train_tasks: int = 2000  # tasks of the train split that RL draws its queries from
  eval_tasks: int = 64  # tasks of the eval split that every evaluation runs
  # ToolHop's AC also accepts an answer contained in the tool response before it (FTRL's
  # reference scorer; False: containment in the answer only, the paper's Eq. 21)
  answer_in_tool_message: bool = False
  cache_dir: str = ""  # built artefacts (toolworld's tokenizer); "" = $TIRJAX_CACHE or ~/.cache
  # The environment's own options (`Environment.options`; toolworld's query mix, `Difficulty`),
  # which `resolve` reads from its own section `env.<name>` (so: no config key); None here: the
  # entry's defaults.
  options: Any = None

  def __post_init__(self):
    checks.one_of("name", self.name, environments.names())
    own = environments.get(self.name).options
    if own is None and self.options is not None:
      raise ValueError(f"options: env {self.name} has no options of its own")
    if own is not None and self.options is None:
      object.__setattr__(self, "options", own())
    elif own is not None and not isinstance(self.options, own):
      raise ValueError(f"options: env {self.name}'s are a {own.__name__}, got "
                       f"{type(self.options).__name__}")
    if environments.get(self.name).needs_data_file and not os.path.exists(self.data_path):
      raise ValueError(f"data_path: {self.data_path!r} does not exist (env.name={self.name})")
    for name in ("train_tasks", "eval_tasks"):
      checks.int_at_least(name, getattr(self, name), 1)
      _within_limit(name, getattr(self, name))
    checks.flag("answer_in_tool_message", self.answer_in_tool_message)


@dataclasses.dataclass(frozen=True)
class JudgeOptions:
  kind: Judge = "rule"  # "rule", or "llm": an OpenAI-compatible endpoint, `votes` votes, majority
  base_url: str = ""  # the LLM judge's OpenAI-compatible endpoint
  model: str = ""  # the LLM judge's model name at that endpoint
  votes: int = 5  # the LLM judge's votes per verdict (majority)
  # the rule judge's (and the LLM judge's no-vote fallback's) abstention rule: "earned"
  # (spec §6) or "claimed" (the old rule that pays 0 for abstaining on answerable tasks; see
  # `tirjax.env.judge.RuleOptions`)
  abstention: Abstention = "earned"

  def __post_init__(self):
    checks.typed_choices(self)
    if self.kind == "llm":
      if not (self.base_url and self.model):
        raise ValueError("base_url: the LLM judge needs judge.base_url and judge.model")
      checks.int_at_least("votes", self.votes, 1)


@dataclasses.dataclass(frozen=True)
class SamplerOptions:
  kind: Sampler = "jax"  # the sampler: JAX in the trainer's process, or vLLM servers
  eval_temperature: float = 0.0  # greedy evaluation
  # evaluations also sample this many episodes per eval task at rollout.temperature and report
  # pass@1/4/16 and the share of tasks with mixed outcomes (RL's headroom); 0: greedy only
  eval_samples: int = 0
  # attach to running servers instead of launching: one URL, or several, comma-separated (a
  # fleet: each request to the server with the fewest outstanding, see `vllm_fleet.py`)
  vllm_url: str = ""
  vllm_servers: int = 1  # servers to launch when vllm_url is empty (more than 1: a fleet)
  # GPU: the share of accelerator memory each launched server may take (0: vLLM's default);
  # set it so that the trainer's XLA share (XLA_PYTHON_CLIENT_MEM_FRACTION) and the servers'
  # fit together (docs/scaling.md). Not exercised on a GPU here.
  vllm_gpu_memory_utilization: float = 0.0
  # GPU: put the servers to sleep while the trainer updates (vLLM's sleep mode: 1 = weights to
  # host memory, KV cache dropped; 2 = both dropped, as each hand-over reloads the weights);
  # 0: off. vLLM offers it on CUDA, ROCm and XPU only. Not exercised on a GPU here.
  vllm_sleep_level: int = 0
  vllm_python: str = ""  # interpreter of the vLLM environment ("" = .venv-vllm or $TIRJAX_VLLM_PYTHON)
  vllm_kv_cache_mib: int = 64  # vLLM on CPU: the KV cache of each launched server, in MiB
  # the launched servers' compute dtype ("" = the model's): "bfloat16" under a float32 trainer
  # is the sampler-trainer mismatch that `loss.rollout_correction` (TIS / MIS) corrects
  vllm_dtype: VllmDtype = ""
  # JAX sampler: continue each row's KV cache across turns (False: re-prefill every turn)
  reuse_cache: bool = True

  def __post_init__(self):
    checks.typed_choices(self)
    checks.int_at_least("eval_samples", self.eval_samples, 0)
    if not self.eval_temperature >= 0:
      raise ValueError(f"eval_temperature: must be >= 0, got {self.eval_temperature!r}")
    if self.kind == "vllm":
      checks.int_at_least("vllm_kv_cache_mib", self.vllm_kv_cache_mib, 1)
      checks.int_at_least("vllm_servers", self.vllm_servers, 1)
      checks.one_of("vllm_sleep_level", self.vllm_sleep_level, (0, 1, 2))
      if not 0 <= self.vllm_gpu_memory_utilization <= 1:
        raise ValueError(f"vllm_gpu_memory_utilization: must lie in [0, 1], got "
                         f"{self.vllm_gpu_memory_utilization!r}")
      if any(not u.strip() for u in self.vllm_url.split(",")) and self.vllm_url:
        raise ValueError(f"vllm_url: an empty URL in {self.vllm_url!r}")
    checks.flag("reuse_cache", self.reuse_cache)


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  steps: int = 100  # RL steps
  queries_per_step: int = 8  # rows per batch = queries_per_step × rows per query
  # Updates per rollout batch (spec §5.1): each of `ppo_epochs` passes shuffles the query groups
  # into mini-batches of `mini_batch_queries` queries (0: the whole batch), one update each.
  mini_batch_queries: int = 0
  ppo_epochs: int = 1  # passes over each rollout batch
  # The policy the loss optimises: False, the raw model (the samplers report its log-probs);
  # True, the sampling policy softmax(z / rollout.temperature), as verl and TRL optimise it:
  # the loss's and the KL reference's log-probs are taken at that temperature and π_old is
  # recomputed by the trainer before the first update. Sampling at a temperature ≠ 1 with
  # False takes the policy gradient of the raw model from another policy's samples (biased).
  tempered_policy: bool = False
  eval_every: int = 20  # RL steps between evaluations; 0: after the last step only
  # Tasks of the evaluations between the first and the last: the first `eval_subset` of
  # env.eval_tasks (0: all). Every evaluation then also logs eval/subset/* over those tasks,
  # a learning curve of one task set that costs a fraction of full evaluations.
  eval_subset: int = 0
  eval_at_start: bool = True  # evaluate the policy before RL (after SFT, if any)
  checkpoint_every: int = 10  # RL steps between checkpoints
  keep_checkpoints: int = 3  # checkpoints kept (the oldest are deleted)
  log_every: int = 1  # RL steps between metric records
  progress_bar: bool = True  # a progress bar (a line per 1/20 of a phase to a file)
  export_final: bool = True  # write the final policy as an HF checkpoint (hf_export/)
  dynamic_sampling_tries: int = 4  # DAPO: extra rollout rounds to refill filtered groups
  # k-step off-policy rollouts (`tirjax.trainer.staleness`): RL step t trains on rollouts sampled
  # by the weights of step max(t − k, 0), through the decoupled objective (needs
  # loss.rollout_correction.is_level = "token"). 0: today's synchronous loop, unchanged.
  max_staleness: int = 0
  # metrics.jsonl always; also TensorBoard and/or W&B ("wandb": pip install 'tirjax[wandb]')
  loggers: tuple = ("tensorboard",)

  def __post_init__(self):
    for name in ("steps", "eval_every", "eval_subset", "dynamic_sampling_tries",
                 "mini_batch_queries", "max_staleness"):
      checks.int_at_least(name, getattr(self, name), 0)
    for name in ("queries_per_step", "checkpoint_every", "keep_checkpoints", "log_every",
                 "ppo_epochs"):
      checks.int_at_least(name, getattr(self, name), 1)
    if self.mini_batch_queries and self.queries_per_step % self.mini_batch_queries:
      raise ValueError(f"mini_batch_queries: {self.mini_batch_queries} does not divide "
                       f"queries_per_step={self.queries_per_step} (mini-batches hold whole "
                       "query groups)")
    for name in ("eval_at_start", "progress_bar", "export_final", "tempered_policy"):
      checks.flag(name, getattr(self, name))
    if (not isinstance(self.loggers, tuple) or len(set(self.loggers)) != len(self.loggers)
        or not set(self.loggers) <= set(rundir.LOGGERS)):
      raise ValueError(f"loggers: must be distinct names among {rundir.LOGGERS}, got "
                       f"{self.loggers!r}")

  @property
  def num_minibatches(self) -> int:
    """Mini-batches (updates) per pass over a rollout batch."""
    return self.queries_per_step // (self.mini_batch_queries or self.queries_per_step)


@dataclasses.dataclass(frozen=True)
class SFTOptions:
  """The supervised warm start: its own keys, its optimizer, loss and demonstrations, and the
  train step it runs (`step`: derived by `resolve` from the `step` section)."""

  steps: int = 0  # SFT steps before RL (0: no warm start)
  batch_size: int = 16  # demonstrations per SFT step
  num_demos: int = 2000  # demonstrations generated for SFT
  # toolworld: the demonstrations' query mix (hops 1-4); () = env.toolworld.hop_weights
  hop_weights: tuple = ()
  optim: OptimizerOptions = OptimizerOptions(learning_rate=1e-5, warmup_steps=10)
  loss: SFTLossOptions = SFTLossOptions()
  # toolworld: how imperfect the demonstrations are; `p_confuse`: demos that take
  # compare/sort/filter/convert's direction at random
  demos: DemoOptions = DemoOptions()
  # packed SFT's micro-batches (`step.packed`), in tokens per batch shard: a batch's forests
  # are cut to fit. Smaller than RL's because a sequence's length only grows within a run
  # (`Packer.ratchet`): one sequence per batch would stay as long as the largest batch's
  # forest (3,072 tokens a step on the default), while micro-batches of 1,024 waste less
  # than one micro-batch per step (2,248; benchmarks/results/bench_sft_cpu.json).
  max_tokens_per_microbatch: int = 1024
  step: StepOptions = StepOptions()

  def __post_init__(self):
    checks.int_at_least("steps", self.steps, 0)
    checks.int_at_least("batch_size", self.batch_size, 1)
    checks.int_at_least("num_demos", self.num_demos, 1)
    checks.int_at_least("max_tokens_per_microbatch", self.max_tokens_per_microbatch, 1)
    _within_limit("num_demos", self.num_demos)


@dataclasses.dataclass(frozen=True)
class CriticOptions:
  """The value model (critic) of the estimators that read values (`needs=("values",)` on their
  registration: `ppo`, `turn_ppo`); unused by every other estimator. A separate trunk copied
  from the policy as RL starts, with a zero scalar head (`tirjax.models.value`), updated each
  RL step after the estimator on the same mini-batches and epochs as the policy."""

  # The critic's own optimizer (AdamW with clipping; verl's critic lr is 1e-5).
  optim: OptimizerOptions = OptimizerOptions(learning_rate=1e-5)
  critic_warmup: int = 0  # first RL steps in which only the critic updates (verl's critic_warmup)
  # Clip of the new value around the rollout's (verl's cliprange_value); None: unclipped.
  cliprange_value: Optional[float] = 0.5
  # The value loss's aggregation mode ("" = loss.aggregation; `tirjax.loss.aggregation.MODES`).
  aggregation: str = ""

  def __post_init__(self):
    checks.int_at_least("critic_warmup", self.critic_warmup, 0)
    checks.finite_above("cliprange_value", self.cliprange_value, 0, none_ok=True)
    if not isinstance(self.aggregation, str):
      raise ValueError(f"aggregation: must be a mode's name or '' (the loss's), got "
                       f"{self.aggregation!r}")
