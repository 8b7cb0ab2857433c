"""The toolworld tokenizer: HF loading, single-id special tokens, round trips, cache."""

import json
import unicodedata

import hypothesis
import hypothesis.strategies as st
import pytest
import transformers
from tokenizers import Tokenizer

from tirjax.env import chat
from tirjax.env.toolworld.demos import make_demos
from tirjax.env.toolworld.tasks import make_tasks
from tirjax.env.toolworld.tokenizer import SPECIAL_TOKENS, TAG_TOKENS, build_tokenizer
from tirjax.env.toolworld.world import ALL_NAMES


@pytest.fixture(scope="module")
def path(tmp_path_factory):
  return build_tokenizer(tmp_path_factory.getbasetemp() / "toolworld_tokenizer")


@pytest.fixture(scope="module")
def tokenizer(path):
  return transformers.AutoTokenizer.from_pretrained(str(path))


def test_loads_with_auto_tokenizer(path, tokenizer):
  assert len(tokenizer) == 2816  # the default vocab_size, exactly
  assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
  assert tokenizer.bos_token is None
  assert tokenizer.encode("hi") == tokenizer.encode("hi", add_special_tokens=False)
  config = json.loads((path / "tokenizer_config.json").read_text())
  assert config["chat_template"] == chat.CHAT_TEMPLATE
  assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {
      p.name for p in path.iterdir()}


def test_special_and_tag_tokens_are_single_ids(tokenizer):
  ids = [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + TAG_TOKENS]
  assert ids == list(range(len(tokenizer) - len(ids), len(tokenizer)))  # the last ids, as Qwen
  for token, token_id in zip(SPECIAL_TOKENS + TAG_TOKENS, ids):
    assert tokenizer.encode(token, add_special_tokens=False) == [token_id]
    text = f"a {token}b\n{token}"
    assert tokenizer.encode(text, add_special_tokens=False).count(token_id) == 2
  assert set(tokenizer.all_special_tokens) >= set(SPECIAL_TOKENS[1:])
  # Tag tokens are kept by skip_special_tokens decoding (as in Qwen3); Qwen specials are not.
  ids = tokenizer.encode("<|im_start|>x<think>y</think><|im_end|>", add_special_tokens=False)
  assert tokenizer.decode(ids, skip_special_tokens=True) == "x<think>y</think>"


@hypothesis.given(st.text(max_size=200))
def test_round_trips_any_text(tokenizer, text):
  text = unicodedata.normalize("NFC", text)
  assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_round_trips_demos_and_names_tokenise_alike(tokenizer):
  demos = make_demos(make_tasks("eval", 40, seed=5))
  for d in demos:
    text = chat.render_conversation(d.messages, d.tools)
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
  # A name is its own piece: the same ids whatever surrounds it.
  name = "Sulan"
  own = tokenizer.encode(name, add_special_tokens=False)
  for context in ('{"name": "%s"}', "Find where %s lives.", "%s, Mira"):
    ids = tokenizer.encode(context % name, add_special_tokens=False)
    assert any(ids[k:k + len(own)] == own for k in range(len(ids)))


def test_chat_template_matches_renderer(tokenizer):
  for d in make_demos(make_tasks("train", 20, seed=8)):
    assert tokenizer.apply_chat_template(d.messages, tools=d.tools, tokenize=False) == (
        chat.render_conversation(d.messages, d.tools))


def test_build_is_cached_deterministic_and_validated(tmp_path):
  a = build_tokenizer(tmp_path / "a", seed=3, vocab_size=1900, n_demos=60)
  stamp = (a / "tokenizer.json").stat().st_mtime_ns
  assert build_tokenizer(tmp_path / "a", seed=3, vocab_size=1900, n_demos=60) == a
  assert (a / "tokenizer.json").stat().st_mtime_ns == stamp  # cached: not rewritten
  b = build_tokenizer(tmp_path / "b", seed=3, vocab_size=1900, n_demos=60)
  assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
  build_tokenizer(tmp_path / "a", seed=3, vocab_size=2000, n_demos=60)  # new inputs: rebuilt
  assert Tokenizer.from_file(str(a / "tokenizer.json")).get_vocab_size() == 2000
  with pytest.raises(ValueError, match="vocab_size"):
    build_tokenizer(tmp_path / "c", vocab_size=100)
  with pytest.raises(ValueError, match="n_demos"):
    build_tokenizer(tmp_path / "c", n_demos=0)


def test_every_pool_name_is_one_token_in_every_context(tokenizer):
  for name in ALL_NAMES:
    for text in (name, f"of {name}?", f'{{"name": "{name}"}}', f"{name}."):
      pieces = [tokenizer.decode([i]) for i in tokenizer.encode(text, add_special_tokens=False)]
      assert name in pieces, (text, pieces)


@hypothesis.given(st.integers(0, 10**9))
def test_digit_runs_split_in_groups_of_three_from_the_left(tokenizer, n):
  digits = str(n)
  pieces = [tokenizer.decode([i]) for i in tokenizer.encode(f"x {digits}.", add_special_tokens=False)]
  groups = [digits[i:i + 3] for i in range(0, len(digits), 3)]
  start = pieces.index(groups[0])
  assert pieces[start:start + len(groups)] == groups
