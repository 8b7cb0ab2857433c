"""IGPO's answer probes (tirjax/train_steps/answer_probe.py): the packed pass, one forward for
all of a batch's probes, equals scoring each probe as a dense sequence of its own, one forward
per probe (float32 tolerance); and the answer templates of both protocols."""

import jax
import numpy as np
import pytest
from flax import nnx

from tirjax import train_steps
from tirjax.env import chat
from tirjax.models.logprobs import token_logprobs
from tirjax.testing import strategies, train_setup as ts
from tirjax.train_steps import answer_probe

OPTS = train_steps.StepOptions(logprob_chunk_size=32, attention_block=8,
                               max_tokens_per_microbatch=64)
ROWS = 24


def batch(seed: int):
  """Trees, independent groups, irregular trees (rows without steps) and padding rows; each
  group's gold answer 1-3 tokens, the template 2."""
  rng = np.random.default_rng(seed)
  r = strategies.mixed_rollouts(rng, num_rows=ROWS, prompt_tokens=5, step_tokens=3,
                                response_tokens=2, vocab_size=ts.VOCAB)
  group, valid = np.asarray(r.group_id), np.asarray(r.row_valid)
  answers = {g: rng.integers(0, ts.VOCAB, rng.integers(1, 4)).tolist() for g in set(group)}
  prefix = rng.integers(0, ts.VOCAB, 2).tolist()
  gold = [answers[g] if v else None for g, v in zip(group, valid)]
  return r, [prefix if g is not None else None for g in gold], gold


def dense_probe(model, r, b: int, t: int, prefix, gold) -> float:
  """Probe t of row b as its own sequence: the row's tokens before step t's first generated
  token, the template, the answer; the mean log-prob of the answer's tokens."""
  tokens, ts_, mask = (np.asarray(x)[b] for x in (r.tokens, r.token_step, r.loss_mask))
  start = next(l for l in range(len(tokens)) if mask[l] and ts_[l] == t)
  seq = np.concatenate([tokens[:start], prefix, gold]).astype(np.int32)[None]
  logp, _ = token_logprobs(model, seq, np.ones_like(seq, bool), chunk_size=32)
  return float(np.mean(np.asarray(logp)[0, -len(gold):]))


@pytest.fixture(scope="module")
def model_and_probe():
  graphdef, params, _, place, _ = ts.setup()
  return graphdef, params, answer_probe.AnswerProbe(graphdef, place, OPTS)


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_probes_equal_one_dense_pass_per_probe(model_and_probe, seed):
  graphdef, params, probe = model_and_probe
  r, prefix, gold = batch(seed)
  calls = []
  jitted = probe.logprobs.jitted
  probe.logprobs.jitted = lambda *a: calls.append(1) or jitted(*a)  # count the forwards
  try:
    got = np.asarray(probe(params, r, prefix, gold))
  finally:
    probe.logprobs.jitted = jitted
  model = nnx.merge(graphdef, params)
  step_valid = np.asarray(r.step_valid) & np.asarray(r.row_valid)[:, None]
  want = np.zeros_like(got)
  lengths = 0
  for b, t in zip(*np.nonzero(step_valid)):
    want[b, t] = dense_probe(model, r, b, t, prefix[b], gold[b])
    lengths += int(np.asarray(r.token_step)[b].tolist().index(t)) + 2 + len(gold[b])
  assert step_valid.sum() > 20 and np.all(want[step_valid] < 0)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  assert not np.any(got[~step_valid])
  # One forward for every probe, and fewer positions than one dense pass per probe would run:
  # each row's history (its trunk) is computed once, not once per turn.
  assert len(calls) == 1
  assert probe.logprobs.last_shapes.forwarded < lengths


def test_probe_of_a_row_shares_its_trunk():
  """A row of 3 steps: its 3 probes are one forest whose size is the history through the last
  step's start plus one template + answer branch per probe."""
  from tirjax.train_steps import forest  # noqa: PLC0415
  r, prefix, gold = batch(0)
  probes = answer_probe.probe_sequences(r, prefix, gold)
  num_steps = np.asarray(r.num_steps) * np.asarray(r.row_valid)
  b = int(np.flatnonzero(num_steps >= 3)[0])
  mine = np.flatnonzero(probes.row == b)
  seqs = [probes.tokens[p, :probes.valid[p].sum()] for p in mine]
  size = forest.build(list(range(len(seqs))), seqs).size
  distinct = len({tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)})
  assert size == distinct < sum(len(s) for s in seqs)


def test_a_row_with_steps_and_no_gold_answer_is_refused():
  r, prefix, gold = batch(0)
  b = int(np.flatnonzero(np.asarray(r.num_steps) * np.asarray(r.row_valid))[0])
  gold[b] = None
  with pytest.raises(ValueError, match=f"row {b} has steps but no gold answer"):
    answer_probe.probe_sequences(r, prefix, gold)


@pytest.mark.parametrize("protocol", chat.ANSWER_PROTOCOLS)
def test_template_then_answer_is_the_protocols_answer_step(protocol):
  """Template + the answer as written = the start of the answer step the policy writes."""
  answer = 'Paris "the capital"'
  step = chat.format_answer_step("", answer, protocol)
  head = answer_probe.answer_template(protocol) + answer_probe.answer_text(answer, protocol)
  assert step.startswith(head) and len(step) > len(head)
  assert head.startswith("<think></think>")


def test_probe_starts_of_a_token_less_step():
  """Step 1 has no generated token: its history ends where step 2's begins."""
  token_step = np.array([[-1, 0, 0, -1, 2, 2, -1]])
  mask = token_step >= 0
  starts = answer_probe.probe_starts(token_step, mask, np.ones_like(mask), np.array([3]))
  np.testing.assert_array_equal(starts, [[1, 4, 4]])
  jax.clear_caches()


@pytest.mark.parametrize("protocol", chat.ANSWER_PROTOCOLS)
def test_toolworld_tokens_of_template_and_answer_decode_to_the_answer_step(tmp_path, protocol):
  """With toolworld's tokenizer, a row's template and gold-answer ids decode to the start of
  the answer step the policy would write; a row without a gold answer gets none."""
  from tirjax.env.toolworld import build_tokenizer  # noqa: PLC0415
  from tirjax.trainer.tasks import load_tokenizer  # noqa: PLC0415
  tok = load_tokenizer(str(build_tokenizer(str(tmp_path / "tok"), seed=0)))
  prefix, gold = answer_probe.answer_ids(tok, ["42", None], protocol)
  assert prefix[1] is None and gold[1] is None and gold[0]
  text = tok.decode(prefix[0] + gold[0])
  assert chat.format_answer_step("", "42", protocol).startswith(text) and text.endswith("42")
