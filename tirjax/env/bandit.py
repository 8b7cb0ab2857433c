"""Doors: a contextual bandit in the agent's chat format, the check that the RL path learns.

Each task is a room; one door among `DOORS`, drawn from the seed, is good in every room. The agent
answers in one step under the `answer_tag` protocol, and each door's whole answer step,
`<think>Door d.</think><answer>d</answer>`, is one token of the doors tokenizer: the choice is the
first sampled token, then `<|im_end|>`. The demonstrations pick doors uniformly, so SFT teaches
the format and nothing about which door is good (success ≈ 1/len(DOORS)); only RL can raise it.

Because the decision is the first sampled token and the answer is the whole step, every usual
pipeline fault stops learning here: an advantage of the wrong sign, a loss mask one token to
the right (it then covers `<|im_end|>` and the token after it, never the door), old log-probs of
another row, or a sampler that never receives the new weights.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Sequence, Union

from tirjax.config import Preset
from tirjax.env import chat
from tirjax.env.registry import Environment, register
from tirjax.env.tools import Task

DOORS = ("red", "green", "blue", "gold", "grey", "pink", "teal", "plum")  # not "A": judges drop articles
ROOMS = 4  # distinct rooms; train and eval tasks cycle through the same rooms
PROTOCOL = "answer_tag"


def answer_step(door: str) -> str:
  """The text of the answer step that opens `door` (one token of the doors tokenizer)."""
  return chat.format_answer_step(f"Door {door}.", door, PROTOCOL)


def good_door(seed: int) -> str:
  """The good door, the same in every room: a hash of the seed. (Per-room doors make a harder,
  contextual bandit; a shared one is learnt in a few dozen steps, which a test can afford.)"""
  digest = hashlib.blake2b(f"doors/{seed}".encode(), digest_size=8).digest()
  return DOORS[int.from_bytes(digest, "little") % len(DOORS)]


def make_tasks(split: str, n: int, seed: int = 0) -> list[Task]:
  """`n` tasks cycling through the rooms (the same rooms for both splits: a bandit has no
  held-out contexts; evaluation measures the greedy policy's success)."""
  if split not in ("train", "eval"):
    raise ValueError(f"split: must be 'train' or 'eval', got {split!r}")
  if n < 0:
    raise ValueError(f"n: must be >= 0, got {n}")
  return [Task(task_id=f"doors-{seed}-{split}-{k}", question=f"Room {k % ROOMS}: which door?",
               tools=(), answer=good_door(seed), metadata={"room": k % ROOMS})
          for k in range(n)]


def demonstrations(tasks: Sequence[Task], tokenizer, num: int, seed: int = 0):
  """(ids, loss mask) of `num` demonstrations: the tasks in turn, each room's k-th
  demonstration opening door k (shifted by the seed), so that every room sees every door
  equally often (for `num` a multiple of rooms × doors) and SFT says nothing of the good one."""
  out, seen = [], {}
  for k in range(num):
    task = tasks[k % len(tasks)]
    room = task.metadata["room"]
    door = DOORS[(seen.get(room, 0) + seed) % len(DOORS)]
    seen[room] = seen.get(room, 0) + 1
    messages = chat.prompt_messages(task.question, PROTOCOL) + [
        {"role": "assistant", "content": answer_step(door)}]
    out.append(chat.encode_conversation(tokenizer, messages, chat.tool_specs(task.tools, PROTOCOL)))
  return out


def build_tokenizer(out_dir: Union[str, os.PathLike], toolworld_dir: Union[str, os.PathLike]
                    ) -> pathlib.Path:
  """The toolworld tokenizer plus one added token per door's answer step, saved in `out_dir`.

  Special added tokens match longest first, so `answer_step(d)` encodes to one id."""
  from transformers import AutoTokenizer
  out = pathlib.Path(out_dir)
  if (out / "tokenizer.json").exists() and (out / "source.txt").exists() and (
      out / "source.txt").read_text() == _source_stamp(toolworld_dir):
    return out
  tok = AutoTokenizer.from_pretrained(str(toolworld_dir))
  tok.add_tokens([answer_step(d) for d in DOORS], special_tokens=True)  # split before `<think>`
  for d in DOORS:
    if len(chat.encode(tok, answer_step(d))) != 1:
      raise RuntimeError(f"doors tokenizer: the answer step of door {d} is not one token")
  out.mkdir(parents=True, exist_ok=True)
  tok.save_pretrained(str(out))
  (out / "source.txt").write_text(_source_stamp(toolworld_dir))
  return out


def _source_stamp(toolworld_dir) -> str:
  build = pathlib.Path(toolworld_dir) / "build.json"
  return build.read_text() + repr(DOORS)


def _draw(env_cfg, seed: int, split: str, n: int, hop_weights: tuple) -> list[Task]:
  del env_cfg, hop_weights  # one kind of room
  return make_tasks(split, n, seed=seed)


def _demonstrations(tasks: Sequence[Task], tokenizer, options, num: int, seed: int) -> list:
  del options  # the doors' demonstrations have no knobs
  return demonstrations(tasks, tokenizer, num, seed=seed)


def _tokenizer(cache_dir: str, seed: int) -> str:
  from tirjax.env.toolworld.environment import tokenizer as toolworld_tokenizer  # noqa: PLC0415
  return str(build_tokenizer(os.path.join(cache_dir, f"doors_tokenizer_seed{seed}"),
                             toolworld_tokenizer(cache_dir, seed)))


# One-token answers in one step, a small model, SFT that teaches the format only, then RL that
# must find each room's door (about 2 min on CPU).
PRESET = Preset("doors", doc="The doors bandit: a small model and a short run.", values={
    "model.tiny": dict(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=32),
    "env.train_tasks": 16, "env.eval_tasks": 16,
    "sft.steps": 60, "sft.batch_size": 16, "sft.num_demos": 256,
    "sft.optim.learning_rate": 3e-3, "sft.optim.schedule": "constant",
    "sft.optim.warmup_steps": 0,
    "optim.learning_rate": 3e-3, "optim.weight_decay": 0.0,
    "rollout.answer_protocol": "answer_tag", "rollout.max_steps": 1, "rollout.max_new_tokens": 4,
    "rollout.shapes.max_tokens": 96, "rollout.shapes.max_steps": 1,
    "train.queries_per_step": 4, "train.eval_every": 10, "train.checkpoint_every": 10,
    "train.steps": 30})

ENVIRONMENT = register(Environment(
    "doors", draw=_draw, demonstrations=_demonstrations, tokenizer=_tokenizer,
    answer_protocols=(PROTOCOL,), presets=(PRESET,), gold_answers=True,
    not_a_benchmark="the doors bandit is a test task, not a benchmark"))
