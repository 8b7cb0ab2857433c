"""A small byte-level BPE tokenizer for toolworld, in Hugging Face format, built on demand.

Trained with `tokenizers` on rendered toolworld demos (both answer protocols) with a small
vocabulary, so that a tiny model learns fast. Qwen's special tokens (`<|endoftext|>`,
`<|im_start|>`, `<|im_end|>`) and the tag tokens (`<think>`, …, `</answer>`, not "special", so
that decoding with `skip_special_tokens` keeps them, as in Qwen3) are single added tokens with the
last ids. The byte-level pipeline is Qwen's (NFC, byte-level BPE without a prefix space) except
for the pre-tokenisation: Qwen's regex splits at every word and punctuation run, which leaves the
fixed system prompt (the tool specs) at ~1,200 tokens; here only digits (one per piece, as Qwen)
and capitalised words (all names) are isolated, so names and numbers tokenise the same way
everywhere while the JSON scaffolding and the fixed texts merge into long tokens.

Entity names and numbers are what a policy copies (from the question and tool responses into
calls and answers), and a 2-layer model copies one token far more reliably than a string of
syllables or digits. So every name of the world's pools (`world.ALL_NAMES`) is one token, and
digit runs split into groups of at most three from the left, each one token (as Llama 3's
tokenizer does: "5199" is "519" "9"). These are added tokens, matched leftmost-longest before
the BPE pre-tokenisation, so they tokenise the same way in every context.

The directory holds `tokenizer.json`, `tokenizer_config.json` (class `PreTrainedTokenizerFast`,
with `chat.CHAT_TEMPLATE`) and `special_tokens_map.json`, so `transformers.AutoTokenizer` (and
vLLM) load it. A build is cached: `build.json` records its inputs, including a digest of the
sources that shape the corpus, and a build with the same inputs returns at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import tempfile
from typing import Union

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

from tirjax.env import chat
from tirjax.env.toolworld import demos, tasks
from tirjax.env.toolworld.world import ALL_NAMES

SPECIAL_TOKENS = (chat.END_OF_TEXT, chat.IM_START, chat.IM_END)
TAG_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
              "</tool_response>", "<answer>", "</answer>")
# Pre-tokenisation: every digit, and every capitalised word (all names), is a piece of its own;
# merges may span everything else (spaces, punctuation, lower-case words).
PRETOKENIZE_REGEX = r"\p{N}|\p{Lu}\p{Ll}*"
# Every digit group of one to three digits ("0" … "999", "00" … "099" included).
DIGIT_GROUPS = tuple(f"{i:0{w}d}" for w in (1, 2, 3) for i in range(10 ** w))
WORD_TOKENS = ALL_NAMES + DIGIT_GROUPS
_NEW_IDS = len(SPECIAL_TOKENS) + len(TAG_TOKENS) + len(WORD_TOKENS) - 10  # digits are bytes
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_SOURCES = ("chat.py", "toolworld/world.py", "toolworld/toolbox.py", "toolworld/queries.py",
            "toolworld/plan.py", "toolworld/tasks.py", "toolworld/demos.py",
            "toolworld/tokenizer.py")


def _source_digest() -> str:
  root = pathlib.Path(__file__).resolve().parents[1]
  h = hashlib.sha256()
  for name in _SOURCES:
    h.update((root / name).read_bytes())
  return h.hexdigest()


def corpus(seed: int, n_demos: int) -> list[str]:
  """Rendered demos of train tasks, in both answer protocols."""
  train = tasks.make_tasks("train", n_demos, seed=seed)
  texts = []
  for i, protocol in enumerate(chat.ANSWER_PROTOCOLS):
    part = train[i::len(chat.ANSWER_PROTOCOLS)]
    for d in demos.make_demos(part, seed, demos.DemoOptions(answer_protocol=protocol)):
      texts.append(chat.render_conversation(d.messages, d.tools))
  return texts


def _train(texts: list[str], vocab_size: int) -> Tokenizer:
  """BPE on the text between added tokens; the added tokens take the last ids (as in Qwen)."""
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  added = _added_pattern()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size - _NEW_IDS,
      min_frequency=2,
      show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator((piece for text in texts for piece in added.split(text) if piece),
                          trainer=trainer)
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in WORD_TOKENS])
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
  return tok


def _added_pattern() -> re.Pattern:
  """What the BPE trainer never sees: the added tokens (names, digits and the tag tokens)."""
  words = sorted(SPECIAL_TOKENS + TAG_TOKENS + ALL_NAMES, key=len, reverse=True)
  return re.compile("|".join(re.escape(t) for t in words) + r"|[0-9]")


def _config(tok: Tokenizer) -> tuple[dict, dict]:
  added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                     "rstrip": False, "single_word": False,
                                     "special": t in SPECIAL_TOKENS}
           for t in SPECIAL_TOKENS + TAG_TOKENS}
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added,
      "additional_special_tokens": [chat.IM_START, chat.IM_END],
      "bos_token": None, "eos_token": chat.IM_END, "pad_token": chat.END_OF_TEXT,
      "unk_token": None, "add_bos_token": False, "add_prefix_space": False,
      "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False,
      "model_max_length": 32768, "chat_template": chat.CHAT_TEMPLATE}
  special_map = {"additional_special_tokens": [chat.IM_START, chat.IM_END],
                 "eos_token": chat.IM_END, "pad_token": chat.END_OF_TEXT}
  return config, special_map


def build_tokenizer(out_dir: Union[str, os.PathLike], seed: int = 0, vocab_size: int = 2816,
                    n_demos: int = 1000) -> pathlib.Path:
  """Builds (or finds cached) the toolworld tokenizer in `out_dir`; returns the directory."""
  if vocab_size < 256 + _NEW_IDS:
    raise ValueError(f"vocab_size: must cover the 256 bytes and the {_NEW_IDS} added tokens, "
                     f"got {vocab_size}")
  if n_demos < 1:
    raise ValueError(f"n_demos: must be >= 1, got {n_demos}")
  out = pathlib.Path(out_dir)
  inputs = {"seed": seed, "vocab_size": vocab_size, "n_demos": n_demos,
            "sources": _source_digest()}
  stamp = out / "build.json"
  if stamp.exists() and json.loads(stamp.read_text()) == inputs and all(
      (out / f).exists() for f in FILES):
    return out
  tok = _train(corpus(seed, n_demos), vocab_size)
  config, special_map = _config(tok)
  out.mkdir(parents=True, exist_ok=True)
  contents = {"tokenizer.json": tok.to_str(pretty=True),
              "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
              "special_tokens_map.json": json.dumps(special_map, indent=2),
              "build.json": json.dumps(inputs, indent=2)}
  for name, text in contents.items():  # atomic per file, build.json last
    with tempfile.NamedTemporaryFile("w", dir=out, delete=False, suffix=".tmp") as f:
      f.write(text)
    os.chmod(f.name, 0o644)
    os.replace(f.name, out / name)
  return out
