"""vLLM serving a tirjax-exported toolworld model: log-probs, tokenizer, hand-over, rollouts.

One server (the session fixture `toolworld`, shared with test_vllm_train.py) serves the
`tiny` model over the toolworld tokenizer's vocabulary, exported with `export_hf`. tirjax is
the reference: vLLM's log-probs of the tokens it sampled must equal `token_logprobs` within
1e-3 (float32 on both sides), in single calls, after weight updates, and in the `Rollouts` of
every rollout mode.
"""

import os
import re
import shutil

import numpy as np
import pytest
import safetensors.numpy
import scipy.special
from flax import nnx

from configs import grpo
from tirjax.env import chat
from tirjax.env.toolworld import make_tasks
from tirjax.sampling.vllm_policy import VLLMPolicySampler
from tirjax.episodes import ArpoOptions, RolloutOptions, Shapes, TreeOptions, rollout
from tirjax.trainer import resolve
from tirjax.rollouts import validate
from tirjax.sampling import handover
from tirjax.sampling.interface import SamplingParams
from tirjax.sampling.teacher import DecoderTeacher, padded_shape
from tirjax.sampling.vllm import SamplerError
from tirjax.sampling.vllm_server import request_json
from tirjax.testing.vllm_toolworld import TOL, perturbed
from tirjax.train_steps.step import split_model

pytestmark = pytest.mark.xdist_group("vllm")

TIE = 1e-4  # logits closer than this are a tie for argmax / top-k
SHAPES = Shapes(num_rows=8, max_steps=3, max_calls=4, max_gt_calls=8, max_tokens=512,
                max_params=4)


def log_softmax_rows(model, seqs):
  """Per sequence, the [len, vocab] next-token log-probs of tirjax's model (one padded call)."""
  rows, width = padded_shape([len(q) for q in seqs])
  tokens = np.zeros((rows, width), np.int32)
  for i, q in enumerate(seqs):
    tokens[i, :len(q)] = q
  logits = np.asarray(nnx.jit(lambda m, t: m(t))(model, tokens), np.float64)
  return [scipy.special.log_softmax(logits[i, :len(q)], axis=-1) for i, q in enumerate(seqs)]


def chat_prompts(tokenizer, num, seed=0):
  return [chat.render_prompt_ids(tokenizer, t, t.question)
          for t in make_tasks("train", num, seed=seed)]


def test_vllm_loads_the_toolworld_tokenizer(toolworld):
  """vLLM's tokenizer is the exported one: special and tag tokens are single ids both ways."""
  tok = toolworld.tokenizer
  task = make_tasks("train", 1, seed=5)[0]
  text = chat.render_conversation(chat.prompt_messages(task.question),
                                  chat.tool_specs(task.tools), add_generation_prompt=True)
  text += "<think>x</think>\n<tool_call>[]</tool_call><|im_end|><|endoftext|>"
  ids = chat.encode(tok, text)
  for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "<tool_call>"):
    assert tok.convert_tokens_to_ids(special) in ids
  url = toolworld.sampler.url
  got = request_json(f"{url}/tokenize", {"model": "policy", "prompt": text,
                                         "add_special_tokens": False})
  assert got["tokens"] == ids
  back = request_json(f"{url}/detokenize", {"model": "policy", "tokens": ids})
  assert back["prompt"] == text


def test_sampled_logprobs_and_top_k_equal_tirjax_ones(toolworld):
  toolworld.use(toolworld.model, "a")
  tok = toolworld.tokenizer
  prompts = chat_prompts(tok, 4)  # rendered chat prompts: they hold special and tag ids
  params = SamplingParams(n=2, max_new_tokens=32, stop_token_ids=chat.stop_token_ids(tok),
                          top_logprobs=5)
  out = toolworld.sampler.generate(prompts, params)
  teacher = DecoderTeacher.of(toolworld.model)
  gap = handover.measure_gap(prompts, out, teacher)
  assert gap.num_tokens > 4 * 2 * 8 and gap.max_abs < TOL, gap
  seqs = [prompt + s.tokens for prompt, group in zip(prompts, out) for s in group]
  logp = log_softmax_rows(toolworld.model, seqs)
  starts = [len(prompt) for prompt, group in zip(prompts, out) for _ in group]
  for row, start, s in zip(logp, starts, [s for group in out for s in group]):
    assert s.policy_version == toolworld.sampler.policy_version
    for k, top in enumerate(s.top_logprobs):
      dist = row[start - 1 + k]
      kth = np.sort(dist)[-5]
      assert len(top) == 5
      for token, lp in top.items():
        assert abs(dist[token] - lp) < TOL and dist[token] >= kth - TIE


def relabelled(model, x: int, im_end: int, boost: float):
  """`model` with token ids x and im_end exchanged, and im_end's embedding scaled by `boost`.

  The embedding is tied: on a prompt that holds no x, relabelled (x ↔ im_end), the new model
  computes the same hidden states as `model` on the original prompt, and its logit of im_end
  is `boost` times the old logit of x, every other logit unchanged."""
  graphdef, state = nnx.split(model)
  embed = state["embed"].get_value()
  embed = embed.at[np.array([x, im_end])].set(embed[np.array([im_end, x])])
  state["embed"].set_value(embed.at[im_end].multiply(boost))
  return nnx.merge(graphdef, state)


def greedy_token_outside_prompt(model, prompts, stops):
  """(x, prompt) for the first prompt whose greedy next token x is neither a stop token nor in
  the prompt (the relabelling needs both) and has a clearly positive logit."""
  for prompt in prompts:
    logits = np.asarray(model(np.asarray([prompt]))[0, -1])
    x = int(np.argmax(logits))
    if x not in stops and x not in prompt and logits[x] > 1.0:
      return x, prompt
  raise AssertionError("no prompt's greedy token lies outside it")


def test_im_end_ends_a_sample_and_is_kept(toolworld):
  """A model whose next token after a chat prompt is `<|im_end|>`, greedily and with
  probability ~0.8: the start model's greedy token x there becomes `<|im_end|>`, boosted."""
  tok = toolworld.tokenizer
  im_end, stops = chat.im_end_id(tok), chat.stop_token_ids(tok)
  x, prompt = greedy_token_outside_prompt(toolworld.model, chat_prompts(tok, 16, seed=7), stops)
  model = relabelled(toolworld.model, x, im_end, boost=1.5)
  relabel = {x: im_end, im_end: x}
  prompt = [relabel.get(t, t) for t in prompt]
  toolworld.use(model, "im_end")
  [[greedy]] = toolworld.sampler.generate(
      [prompt], SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=stops))
  assert greedy.tokens == [im_end] and greedy.finish_reason == "stop"
  [samples] = toolworld.sampler.generate(
      [prompt], SamplingParams(n=8, max_new_tokens=8, stop_token_ids=stops))
  assert any(s.finish_reason == "stop" for s in samples)  # each stops at once w.p. ~0.8
  for s in samples:
    assert not set(s.tokens[:-1]) & set(stops)
    assert (s.tokens[-1] in stops) == (s.finish_reason == "stop")
  gap = handover.measure_gap([prompt], [samples + [greedy]], DecoderTeacher.of(model))
  assert gap.max_abs < TOL, gap


def corrupt(src: str, dst: str) -> None:
  """A copy of the export `src` with one MLP weight tripled."""
  shutil.copytree(src, dst)
  path = os.path.join(dst, "model.safetensors")
  tensors = safetensors.numpy.load_file(path)
  tensors["model.layers.1.mlp.down_proj.weight"] *= 3.0
  safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})


def test_trainer_handover_changes_outputs_and_a_corrupted_one_is_caught(toolworld, tmp_path):
  config = grpo.get_config("model=tiny,sampler=vllm")
  config.sampler.vllm_url = toolworld.sampler.url
  graphdef, params = split_model(toolworld.model)
  exp = resolve.resolve(config)
  policy = VLLMPolicySampler(exp.sampler, exp.step.logprob_chunk_size, exp.rollout.shapes,
                             graphdef, params, toolworld.tokenizer_dir, str(tmp_path))
  try:
    prompts = chat_prompts(toolworld.tokenizer, 3, seed=9)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    policy.update(params, 1)
    assert policy.last_handover.gap.max_abs < TOL and policy.last_export_s > 0
    before = policy.generate(prompts, greedy)
    assert all(g[0].policy_version == 1 for g in before)
    new = perturbed(toolworld.model, 0.05, seed=1)
    _, new_params = split_model(new)
    policy.update(new_params, 2)
    report = policy.last_handover
    assert report.policy_version == 2 and report.gap.max_abs < TOL and report.gap.num_tokens > 0
    after = policy.generate(prompts, greedy)
    assert [g[0].tokens for g in after] != [g[0].tokens for g in before]
    assert all(g[0].policy_version == 2 for g in after)
    assert handover.measure_gap(prompts, after, DecoderTeacher.of(new)).max_abs < TOL
    policy.update(new_params, 2)  # the version it holds: no hand-over
    assert policy.last_handover is report

    bad = str(tmp_path / "bad")
    corrupt(report.weights_path, bad)
    with pytest.raises(handover.WeightMismatchError) as caught:
      policy.sampler.load_weights(bad, teacher_logprobs=DecoderTeacher.of(new))
    gap = caught.value.gap
    assert gap.max_abs > 0.05
    assert re.search(r"differ by up to ([0-9.e+-]+)", str(caught.value)).group(1) == \
        f"{gap.max_abs:.4g}"
    with pytest.raises(SamplerError, match="failed the hand-over check"):
      policy.generate(prompts, greedy)
    policy.update(params, 3)  # a good hand-over lifts the block
    assert policy.generate(prompts, greedy)[0][0].policy_version == 3
  finally:
    policy.close()
  assert toolworld.sampler.server.running()  # attached: closing leaves the server up


MODES = {
    "independent": RolloutOptions(mode="independent", n=2, max_steps=3, max_new_tokens=24,
                                  seed=1, shapes=SHAPES),
    "tree": RolloutOptions(mode="tree", n=2, max_steps=3, max_new_tokens=24, seed=1,
                           tree=TreeOptions(branch_factor=2), shapes=SHAPES),
    # Every try branches (τ = 1): the budget N = 4 rows per query is what stops it.
    "arpo": RolloutOptions(mode="arpo", max_steps=3, max_new_tokens=24, seed=1, shapes=SHAPES,
                           arpo=ArpoOptions(initial_rollouts=2, total_rollouts=4, beam_size=2,
                                            branch_probability=1.0, entropy_tokens=8,
                                            top_logprobs=5)),
}


@pytest.fixture(scope="module")
def rollouts(toolworld):
  toolworld.use(toolworld.model, "a")
  tasks = make_tasks("train", 2, seed=3)
  out = {}
  for mode, options in MODES.items():
    before = toolworld.sampler.prefix_cache()
    batch = rollout(toolworld.sampler, toolworld.tokenizer, tasks, options)
    after = toolworld.sampler.prefix_cache()
    out[mode] = (batch, {k: after[k] - before[k] for k in after})
  return out


@pytest.mark.parametrize("mode", list(MODES))
def test_rollouts_are_valid_and_carry_tirjax_logprobs(toolworld, rollouts, mode):
  batch, _ = rollouts[mode]
  r = validate(batch.rollouts)
  valid = np.asarray(r.row_valid)
  rows = MODES[mode].rows_per_query * 2
  assert valid.sum() == rows == len(batch.episodes)
  assert (np.asarray(r.policy_version)[valid] == toolworld.sampler.policy_version).all()
  tokens, token_valid = np.asarray(r.tokens), np.asarray(r.token_valid)
  seqs = [tokens[b, token_valid[b]].tolist() for b in np.flatnonzero(valid)]
  want = DecoderTeacher.of(toolworld.model)(seqs)
  mask = np.asarray(r.loss_mask)
  old = np.asarray(r.old_logprobs)
  assert mask.any()
  for i, b in enumerate(np.flatnonzero(valid)):
    n = len(seqs[i])
    np.testing.assert_allclose(old[b, :n][mask[b, :n]], np.asarray(want[i])[mask[b, :n]],
                               atol=TOL, rtol=0)
  stops = set(chat.stop_token_ids(toolworld.tokenizer))
  steps = np.asarray(r.token_step)
  for b in np.flatnonzero(valid):  # each step: at most max_new_tokens, a stop token only last
    for t in range(int(r.num_steps[b])):
      ids = tokens[b, steps[b] == t].tolist()
      assert 1 <= len(ids) <= 24 and not stops & set(ids[:-1])


def test_tree_rollouts_hit_the_prefix_cache(toolworld, rollouts):
  assert "--enable-prefix-caching" in toolworld.sampler.server.command(8000)
  _, cache = rollouts["tree"]
  # Every step after the first resends its row's prompt and steps: whole blocks of them hit.
  assert cache["queries"] > 0 and cache["hits"] > 0.3 * cache["queries"], cache


def test_arpo_branches_on_top_k_entropies_within_its_budget(rollouts):
  batch, _ = rollouts["arpo"]
  groups = np.asarray(batch.rollouts.group_id)[np.asarray(batch.rollouts.row_valid)]
  assert sorted(np.bincount(groups).tolist()) == [4, 4]  # N = 4 per query, never more
  sources = [s for entry in batch.trace for s in entry["sources"]]
  assert sum(copies for _, _, copies in sources) > 0
  # ΔH is a difference of top-k entropy scores: finite, and not all zero.
  deltas = [delta for _, delta, _ in sources]
  assert np.isfinite(deltas).all() and np.abs(deltas).max() > 0
