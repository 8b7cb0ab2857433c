"""The vLLM sampler on a real vLLM server (from `.venv-vllm`) of a tiny random Qwen3.

transformers' PyTorch model is the reference: vLLM's log-probs of the tokens it sampled must
equal the teacher-forced ones, greedy decoding its argmax, top-k its top-k. One server serves
the whole module (start-up costs a minute on two cores); every test hands over the weights it
needs first, so the tests do not depend on each other's order.
"""

import dataclasses
import os
import re
import shutil

import numpy as np
import pytest
import safetensors.torch
import scipy.special

from tirjax.sampling import handover
from tirjax.sampling.interface import SamplingParams
from tirjax.sampling.vllm import SamplerError, VLLMOptions, VLLMSampler
from tirjax.testing import tiny_hf, vllm_processes as support

pytestmark = pytest.mark.xdist_group("vllm")

TOL = 1e-3  # float32 on both sides
TIE = 1e-4  # logits closer than this are a tie for argmax / top-k


@dataclasses.dataclass
class Models:
  dirs: dict  # name -> HF directory: "a", "b" (other seed), "bad" (b with a corrupted tensor)
  torch: dict  # name -> transformers model ("a", "b")

  def teacher(self, name):
    return tiny_hf.torch_teacher(self.torch[name])


@pytest.fixture(scope="session")
def models(tmp_path_factory):
  root = tmp_path_factory.mktemp("vllm_models")
  dirs = {name: str(root / name) for name in ("a", "b", "bad")}
  torch_models = {"a": tiny_hf.save_model(dirs["a"], seed=0),
                  "b": tiny_hf.save_model(dirs["b"], seed=1)}
  shutil.copytree(dirs["b"], dirs["bad"])
  path = os.path.join(dirs["bad"], "model.safetensors")
  tensors = safetensors.torch.load_file(path)
  tensors["model.layers.1.mlp.down_proj.weight"] *= 3.0
  safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
  return Models(dirs=dirs, torch=torch_models)


@pytest.fixture(scope="module")  # its server is gone before test_vllm_toolworld.py starts one
def sampler(models):
  s = VLLMSampler(VLLMOptions(server=support.server_options(models.dirs["a"])))
  yield s
  tag = s.server.tag
  s.close()
  assert support.tagged_pids(tag) == []


def use(sampler, models, name):
  report = sampler.load_weights(models.dirs[name], teacher_logprobs=models.teacher(name))
  assert report.gap.max_abs < TOL
  return report


def prompts(num, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(2, 256, size=rng.integers(1, 20)).tolist() for _ in range(num)]


def test_sampled_logprobs_equal_teacher_forced_ones(sampler, models):
  use(sampler, models, "a")
  batch = prompts(8)
  out = sampler.generate(batch, SamplingParams(n=2, max_new_tokens=24))
  assert [len(g) for g in out] == [2] * 8
  for group in out:
    for s in group:
      assert len(s.tokens) == len(s.logprobs) == 24 and s.finish_reason == "length"
      assert all(0 <= t < 256 for t in s.tokens) and s.policy_version == sampler.policy_version
  gap = handover.measure_gap(batch, out, models.teacher("a"))
  assert gap.num_tokens == 8 * 2 * 24 and gap.max_abs < TOL, gap


def test_greedy_is_the_teachers_argmax(sampler, models):
  use(sampler, models, "a")
  batch = prompts(6, seed=1)
  out = sampler.generate(batch, SamplingParams(temperature=0.0, max_new_tokens=16))
  for prompt, [s] in zip(batch, out):
    seq = prompt + s.tokens
    logits = tiny_hf.torch_logits(models.torch["a"], seq)
    for k, token in enumerate(s.tokens):
      row = logits[len(prompt) - 1 + k]
      assert row[token] >= row.max() - TIE, (k, token, int(row.argmax()))


def test_top_logprobs_are_the_teachers_top_k(sampler, models):
  use(sampler, models, "a")
  batch = prompts(4, seed=2)
  out = sampler.generate(batch, SamplingParams(max_new_tokens=8, top_logprobs=5))
  for prompt, [s] in zip(batch, out):
    logp = scipy.special.log_softmax(
        tiny_hf.torch_logits(models.torch["a"], prompt + s.tokens), axis=-1)
    for k, top in enumerate(s.top_logprobs):
      row = logp[len(prompt) - 1 + k]
      assert len(top) == 5 and list(top.values()) == sorted(top.values(), reverse=True)
      kth = np.sort(row)[-5]
      for token, lp in top.items():
        assert abs(row[token] - lp) < TOL and row[token] >= kth - TIE


def test_stop_token_ids_end_samples_and_are_kept(sampler, models):
  use(sampler, models, "a")
  stop = tuple(range(2, 66))  # a quarter of the vocabulary: most samples stop early
  out = sampler.generate(prompts(8, seed=3), SamplingParams(n=2, max_new_tokens=24,
                                                            stop_token_ids=stop))
  samples = [s for g in out for s in g]
  assert any(s.finish_reason == "stop" for s in samples)
  for s in samples:
    assert not set(s.tokens[:-1]) & set(stop)
    if s.finish_reason == "stop":
      assert s.tokens[-1] in stop
    else:
      assert s.finish_reason == "length" and len(s.tokens) == 24 and s.tokens[-1] not in stop


def test_n_samples_are_independent_also_for_equal_prompts(sampler, models):
  use(sampler, models, "a")
  out = sampler.generate([[5, 6, 7], [5, 6, 7]], SamplingParams(n=4, max_new_tokens=12))
  seqs = [tuple(s.tokens) for g in out for s in g]
  assert len(seqs) == 8 and len(set(seqs)) == 8


def test_handover_changes_outputs_tags_the_version_and_passes_the_check(sampler, models):
  use(sampler, models, "a")
  batch = prompts(4, seed=4)
  greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
  before = sampler.generate(batch, greedy)
  version = sampler.policy_version
  # The tiny model ties its embeddings: without the worker extension's re-processing, vLLM on
  # CPU keeps the old LM head and this hand-over fails its own check.
  report = use(sampler, models, "b")
  assert report.policy_version == sampler.policy_version == version + 1
  assert report.reload_s < 10 and report.gap.num_tokens > 0
  after = sampler.generate(batch, greedy)
  assert [g[0].tokens for g in after] != [g[0].tokens for g in before]
  assert all(g[0].policy_version == version + 1 for g in after)
  gap = handover.measure_gap(batch, after, models.teacher("b"))
  assert gap.max_abs < TOL
  report = sampler.load_weights(models.dirs["a"], version=100,
                                teacher_logprobs=models.teacher("a"))
  assert sampler.policy_version == report.policy_version == 100


def test_a_wrong_handover_is_caught_with_its_gap(sampler, models):
  use(sampler, models, "a")
  version = sampler.policy_version
  with pytest.raises(handover.WeightMismatchError) as caught:
    sampler.load_weights(models.dirs["bad"], teacher_logprobs=models.teacher("b"))
  gap = caught.value.gap
  assert gap.max_abs > 0.05
  assert re.search(r"differ by up to ([0-9.e+-]+)", str(caught.value)).group(1) == \
      f"{gap.max_abs:.4g}"
  assert sampler.policy_version == version
  with pytest.raises(SamplerError, match="failed the hand-over check"):
    sampler.generate([[5]], SamplingParams())
  use(sampler, models, "b")  # a good hand-over lifts the block
  assert sampler.generate([[5]], SamplingParams())[0][0].policy_version == version + 1


def test_server_killed_mid_batch_is_restarted_once_with_the_current_weights(sampler, models):
  use(sampler, models, "b")  # differs from the model the server starts from
  old = sampler.server.pids()
  restarts = sampler.restarts
  batch = prompts(64, seed=5)
  params = SamplingParams(n=2, max_new_tokens=96)
  # Killed while requests are out at the server (sent, not answered): its request gauges
  # are updated too rarely on two loaded cores to stage the kill on them.
  out = support.kill_mid_batch(lambda: sampler.generate(batch, params), sampler.url,
                               support.api_server_pid(sampler.server),
                               in_flight=lambda: sampler.in_flight > 0)
  assert sampler.restarts == restarts + 1
  assert not set(old) & set(sampler.server.pids())  # the old tree is gone entirely
  gap = handover.measure_gap(batch, out, models.teacher("b"))
  assert gap.num_tokens == 64 * 2 * 96 and gap.max_abs < TOL
