"""The doors bandit (`tirjax.env.bandit`): one-token answer steps, demonstrations that favour no
door, and tasks whose answer is the seed's good door."""

import collections

import pytest
import transformers

from tirjax.env import bandit, chat
from tirjax.env.parser import StepParser
from tirjax.env.tools import agent_tools
from tirjax.env.toolworld import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  base = tmp_path_factory.mktemp("doors")
  toolworld = build_tokenizer(base / "toolworld")
  return transformers.AutoTokenizer.from_pretrained(
      str(bandit.build_tokenizer(base / "doors", toolworld)))


def test_each_answer_step_is_one_token_and_parses_to_its_door(tokenizer):
  task = bandit.make_tasks("train", 1)[0]
  parser = StepParser(agent_tools(task, bandit.PROTOCOL), bandit.PROTOCOL)
  ids = set()
  for door in bandit.DOORS:
    (token,) = chat.encode(tokenizer, bandit.answer_step(door))
    ids.add(token)
    assert tokenizer.decode([token]) == bandit.answer_step(door)
    parsed = parser.parse(bandit.answer_step(door))
    assert parsed.answer == door, door
  assert len(ids) == len(bandit.DOORS)


def test_demonstrations_open_every_door_equally_often_in_every_room(tokenizer):
  tasks = bandit.make_tasks("train", 16, seed=3)[4:]  # any offset of the stream
  num = bandit.ROOMS * len(bandit.DOORS) * 2
  counts = collections.Counter()
  answer_ids = {chat.encode(tokenizer, bandit.answer_step(d))[0]: d for d in bandit.DOORS}
  for task, (ids, mask) in zip([tasks[k % len(tasks)] for k in range(num)],
                               bandit.demonstrations(tasks, tokenizer, num, seed=3)):
    trained = [t for t, m in zip(ids, mask) if m]
    doors = [answer_ids[t] for t in trained if t in answer_ids]
    assert len(doors) == 1  # the answer step, a target of the SFT loss
    counts[task.metadata["room"], doors[0]] += 1
  assert set(counts.values()) == {2}
  assert len(counts) == bandit.ROOMS * len(bandit.DOORS)


def test_tasks_share_the_seeds_good_door():
  doors = {bandit.good_door(seed) for seed in range(40)}
  assert len(doors) > 1  # the seed picks it
  tasks = bandit.make_tasks("eval", 8, seed=5)
  assert {t.answer for t in tasks} == {bandit.good_door(5)}
  assert [t.metadata["room"] for t in tasks] == [k % bandit.ROOMS for k in range(8)]
  assert bandit.make_tasks("eval", 8, seed=5) == tasks


@pytest.mark.parametrize("split, n, match", [("test", 1, "split"), ("train", -1, "n")])
def test_bad_arguments_are_named(split, n, match):
  with pytest.raises(ValueError, match=match):
    bandit.make_tasks(split, n)
