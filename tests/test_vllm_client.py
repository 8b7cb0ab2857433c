"""The vLLM sampler's protocol, parsing and failure handling against a fake OpenAI server.

A real vLLM server is exercised in test_vllm_sampler.py; here a few-line HTTP server answers in
vLLM's format, so that every failure path (time-out, HTTP 5xx, 4xx, a dead server, malformed
answers, a failed restart) runs in milliseconds.
"""

import http.server
import json
import threading
import time

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from tirjax.sampling import handover
from tirjax.sampling.interface import Sample, SamplingParams
from tirjax.sampling.vllm import SamplerError, VLLMOptions, VLLMSampler
from tirjax.sampling.vllm_server import RequestRejected, ServerOptions, VLLMServer
from tirjax.testing import tiny_hf


def vllm_choice(index, tokens, logprobs, finish="length", top=None):
  """One completion choice as vLLM 0.32 returns it with return_tokens_as_token_ids."""
  names = [f"token_id:{t}" for t in tokens]
  return {"index": index, "text": "", "finish_reason": finish, "token_ids": list(tokens),
          "stop_reason": tokens[-1] if finish == "stop" else None,
          "logprobs": {"tokens": names, "token_logprobs": list(logprobs),
                       "top_logprobs": top or [{n: lp} for n, lp in zip(names, logprobs)],
                       "text_offset": [0] * len(tokens)}}


def echo_completion(payload):
  """Samples token ids prompt[-1] + 1, + 2, …: n choices, each one token further."""
  choices = []
  for j in range(payload["n"]):
    tokens = [payload["prompt"][-1] + 1 + k for k in range(payload["max_tokens"] - j)]
    choices.append(vllm_choice(j, tokens, [-0.5 - k for k in range(len(tokens))]))
  return 200, {"choices": choices}


class FakeServer:
  """`/health` and `/v1/completions`, whose answer `completion(payload)` decides.

  After an HTTP 5xx answer `/health` fails too (as vLLM's does once its engine died), unless
  `stays_healthy`.
  """

  def __init__(self, completion=echo_completion, stays_healthy=False,
               rpc=lambda payload: (200, {"results": [None]})):
    self.completion = completion
    self.rpc = rpc
    self.stays_healthy = stays_healthy
    self.health = 200
    self.metrics = ""  # the Prometheus text of GET /metrics
    self.requests = []
    fake = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def do_GET(self):
        if self.path == "/metrics":
          data = fake.metrics.encode()
          self.send_response(200)
          self.send_header("Content-Length", str(len(data)))
          self.end_headers()
          self.wfile.write(data)
        else:
          self.reply(fake.health, {}) if self.path == "/health" else self.reply(404, {})

      def do_POST(self):
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fake.requests.append((self.path, payload))
        if self.path == "/v1/completions":
          status, body = fake.completion(payload)
          if status >= 500 and not fake.stays_healthy:
            fake.health = 503
          self.reply(status, body)
        else:
          self.reply(*fake.rpc(payload))

    class Server(http.server.ThreadingHTTPServer):
      def handle_error(self, request, client_address):
        pass  # a client that timed out has hung up: writing to it fails, as intended

    self.httpd = Server(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
    threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def fake():
  server = FakeServer()
  yield server
  server.close()


class FakeLaunched:
  """Stands in for a launched VLLMServer: `restart()` points the sampler at a new fake."""

  def __init__(self, completion):
    self.completion = completion
    self.servers = []
    self.url = None
    self.log_path = "/dev/null"

  def restart(self):
    server = FakeServer(self.completion)
    self.servers.append(server)
    self.url = server.url

  def log_tail(self):
    return "(fake log)"

  def close(self):
    for server in self.servers:
      server.close()


def owned_sampler(url, completion):
  """A sampler that believes it launched the server at `url`; restarts answer `completion`."""
  sampler = VLLMSampler(VLLMOptions(url=url, health_timeout_s=1.0))
  sampler._server = FakeLaunched(completion)  # what __init__ sets when it launches one
  return sampler


def test_generate_parses_token_ids_logprobs_and_finish_reasons(fake):
  sampler = VLLMSampler(VLLMOptions(url=fake.url))
  out = sampler.generate([[3, 4], [9]], SamplingParams(n=2, max_new_tokens=3))
  assert [[s.tokens for s in group] for group in out] == [[[5, 6, 7], [5, 6]], [[10, 11, 12],
                                                                              [10, 11]]]
  assert out[0][0].logprobs == [-0.5, -1.5, -2.5]
  assert all(s.finish_reason == "length" and s.policy_version == 0 and s.top_logprobs is None
             for group in out for s in group)


def test_request_is_token_in_token_out_and_fully_specified(fake):
  sampler = VLLMSampler(VLLMOptions(url=fake.url))
  params = SamplingParams(n=3, temperature=0.7, top_p=0.9, max_new_tokens=5,
                          stop_token_ids=(7, 8), seed=11)
  sampler.generate([[1, 2], [1, 2]], params)
  payloads = [p for path, p in fake.requests if path == "/v1/completions"]
  assert sorted(p["prompt"] for p in payloads) == [[1, 2], [1, 2]]
  for p in payloads:
    assert p["return_tokens_as_token_ids"] and p["ignore_eos"] and p["logprobs"] == 0
    assert (p["n"], p["temperature"], p["top_p"], p["top_k"], p["max_tokens"]) == (3, 0.7, 0.9,
                                                                                     0, 5)
    assert p["stop_token_ids"] == [7, 8]
  # Equal prompts in one batch, and the same prompt in a later call, get distinct seeds,
  # spaced so that vLLM's seed, seed + 1, … of the n samples cannot collide.
  sampler.generate([[1, 2]], params)
  seeds = sorted(p["seed"] for path, p in fake.requests if path == "/v1/completions")
  assert len(seeds) == 3 and all(b - a >= params.n for a, b in zip(seeds, seeds[1:]))


def test_stop_token_is_kept_and_top_logprobs_are_the_k_best():
  def completion(payload):
    top = [{"token_id:5": -0.1, "token_id:6": -2.0, "token_id:9": -3.0, "token_id:4": -9.0},
           {"token_id:7": -0.2, "token_id:1": -1.9, "token_id:2": -2.5}]
    return 200, {"choices": [vllm_choice(0, [5, 7], [-0.1, -0.2], "stop", top)]}
  server = FakeServer(completion)
  try:
    sampler = VLLMSampler(VLLMOptions(url=server.url))
    [[s]] = sampler.generate([[1]], SamplingParams(stop_token_ids=(7,), top_logprobs=2))
    assert s.tokens == [5, 7] and s.finish_reason == "stop"
    assert s.top_logprobs == [{5: -0.1, 6: -2.0}, {7: -0.2, 1: -1.9}]
    assert list(s.top_logprobs[0]) == [5, 6]  # best first
  finally:
    server.close()


@pytest.mark.parametrize("choice, match", [
    ({"tokens": ["w5"]}, "not 'token_id:<id>'"),
    ({"finish_reason": "abort"}, "reason 'abort'"),
    ({"finish_reason": "stop"}, "not on a stop token"),
    ({"token_ids": [99]}, "differ from the ids"),
])
def test_malformed_answers_raise(choice, match):
  def completion(payload):
    c = vllm_choice(0, [5], [-0.1])
    c.update({k: v for k, v in choice.items() if k != "tokens"})
    if "tokens" in choice:
      c["logprobs"]["tokens"] = choice["tokens"]
    return 200, {"choices": [c]}
  server = FakeServer(completion)
  try:
    with pytest.raises(SamplerError, match=match):
      VLLMSampler(VLLMOptions(url=server.url)).generate([[1]], SamplingParams())
  finally:
    server.close()


def test_request_timeout_of_an_attached_server_is_a_clear_error():
  def slow(payload):
    time.sleep(1.0)
    return echo_completion(payload)
  server = FakeServer(slow)
  try:
    sampler = VLLMSampler(VLLMOptions(url=server.url, request_timeout_s=0.2))
    with pytest.raises(SamplerError, match=r"attached, so not restarted.*no answer within 0.2 s"):
      sampler.generate([[1]], SamplingParams())
  finally:
    server.close()


def test_client_errors_are_not_retried():
  server = FakeServer(lambda payload: (400, {"error": {"message": "prompt too long"}}))
  try:
    sampler = owned_sampler(server.url, echo_completion)
    with pytest.raises(RequestRejected, match="prompt too long"):
      sampler.generate([[1]], SamplingParams())
    assert sampler.restarts == 0
  finally:
    server.close()


def test_dead_server_is_restarted_once_and_the_batch_retried():
  server = FakeServer()
  sampler = owned_sampler(server.url, echo_completion)
  server.close()
  try:
    out = sampler.generate([[1], [2]], SamplingParams(max_new_tokens=2))
    assert [[s.tokens for s in g] for g in out] == [[[2, 3]], [[3, 4]]]
    assert sampler.restarts == 1
  finally:
    sampler.close()


def test_server_error_mid_batch_restarts_once_then_gives_a_clear_error():
  broken = lambda payload: (500, {"error": {"message": "EngineDeadError"}})  # noqa: E731
  server = FakeServer(broken)
  sampler = owned_sampler(server.url, broken)
  try:
    with pytest.raises(SamplerError, match=r"(?s)failed again after a restart.*HTTP 500.*"
                                           r"first failure.*EngineDeadError.*\(fake log\)"):
      sampler.generate([[1], [2]], SamplingParams())
    assert sampler.restarts == 1
  finally:
    sampler.close()
    server.close()


def test_server_error_of_a_healthy_server_is_not_retried():
  server = FakeServer(lambda payload: (500, {"error": {"message": "bad request"}}),
                      stays_healthy=True)
  sampler = owned_sampler(server.url, echo_completion)
  try:
    with pytest.raises(SamplerError, match="is healthy but failed the request.*bad request"):
      sampler.generate([[1]], SamplingParams())
    assert sampler.restarts == 0
  finally:
    sampler.close()
    server.close()


def test_restart_reloads_the_current_weights(tmp_path):
  (tmp_path / "model.safetensors").write_bytes(b"")
  server = FakeServer()
  sampler = owned_sampler(server.url, echo_completion)
  try:
    report = sampler.load_weights(str(tmp_path), version=7)
    assert report.policy_version == 7 and report.gap is None
    server.close()  # the server dies; the next batch restarts it
    out = sampler.generate([[1]], SamplingParams(max_new_tokens=1))
    assert out[0][0].policy_version == 7 and sampler.restarts == 1
    restarted = sampler.server.servers[0]
    assert [path for path, _ in restarted.requests[:3]] == [
        "/collective_rpc", "/collective_rpc", "/reset_prefix_cache"]
    assert restarted.requests[0][1] == {"method": "reload_weights",
                                        "kwargs": {"weights_path": str(tmp_path)}}
    assert restarted.requests[1][1] == {"method": "refresh_tied_weights"}
  finally:
    sampler.close()


def test_failed_handover_check_blocks_sampling_until_a_good_one(fake, tmp_path):
  (tmp_path / "model.safetensors").write_bytes(b"")
  sampler = VLLMSampler(VLLMOptions(url=fake.url, probe_prompts=((1, 2),), probe_new_tokens=3))

  def teacher(offset):
    # The echo server samples prompt[-1] + 1, … with log-probs -0.5, -1.5, -2.5.
    return lambda seqs: [[0.0] * 2 + [-0.5 - offset, -1.5, -2.5] for _ in seqs]

  with pytest.raises(handover.WeightMismatchError, match=r"differ by up to 0\.25 .*tolerance"):
    sampler.load_weights(str(tmp_path), teacher_logprobs=teacher(0.25))
  assert sampler.policy_version == 0
  with pytest.raises(SamplerError, match="failed the hand-over check"):
    sampler.generate([[1]], SamplingParams())
  report = sampler.load_weights(str(tmp_path), teacher_logprobs=teacher(0.0))
  assert report.policy_version == 1 and report.gap.max_abs == 0.0
  assert sampler.generate([[1]], SamplingParams())[0][0].policy_version == 1


def test_failed_reload_blocks_sampling_until_a_good_one(tmp_path):
  (tmp_path / "model.safetensors").write_bytes(b"")
  fails = [True]
  server = FakeServer(rpc=lambda payload: (500, {"error": "shape mismatch"}) if fails[0] else (
      200, {"results": [None]}), stays_healthy=True)
  try:
    sampler = VLLMSampler(VLLMOptions(url=server.url))
    with pytest.raises(SamplerError, match="healthy but failed the request.*shape mismatch"):
      sampler.load_weights(str(tmp_path))
    with pytest.raises(SamplerError, match="hand-over of .* did not complete"):
      sampler.generate([[1]], SamplingParams())
    fails[0] = False
    assert sampler.load_weights(str(tmp_path)).policy_version == 1
    assert sampler.generate([[1]], SamplingParams())[0][0].policy_version == 1
  finally:
    server.close()


def test_a_prompt_that_vllm_changed_is_an_error():
  def completion(payload):  # as a server that prepends a BOS token would answer
    status, body = echo_completion(payload)
    for c in body["choices"]:
      c["prompt_token_ids"] = [0] + payload["prompt"]
    return status, body
  server = FakeServer(completion)
  try:
    with pytest.raises(SamplerError, match=r"ran prompt ids \[0, 3, 4\].*2 ids sent \[3, 4\]"):
      VLLMSampler(VLLMOptions(url=server.url)).generate([[3, 4]], SamplingParams())
  finally:
    server.close()


def missing_extension(payload):
  if payload.get("method") == "refresh_tied_weights":
    return 500, {"error": {"message": "Call to collective_rpc method failed: 'CPUWorker' object "
                                      "has no attribute 'refresh_tied_weights'"}}
  return 200, {"results": [None]}


def test_an_attached_server_without_the_worker_extension_still_reloads(tmp_path):
  (tmp_path / "model.safetensors").write_bytes(b"")
  server = FakeServer(rpc=missing_extension, stays_healthy=True)
  try:
    sampler = VLLMSampler(VLLMOptions(url=server.url))
    assert sampler.load_weights(str(tmp_path)).policy_version == 1
    assert [p.get("method") for path, p in server.requests] == [
        "reload_weights", "refresh_tied_weights", None]  # then /reset_prefix_cache
    owned = owned_sampler(server.url, echo_completion)  # launched servers have it: an error
    with pytest.raises(SamplerError, match="no attribute 'refresh_tied_weights'"):
      owned.load_weights(str(tmp_path))
  finally:
    server.close()


def test_prefix_cache_counters_are_read_from_the_metrics(fake):
  fake.metrics = (
      "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of tokens.\n"
      "# TYPE vllm:prefix_cache_hits_total counter\n"
      'vllm:prefix_cache_hits_total{engine="0",model_name="policy"} 640.0\n'
      'vllm:prefix_cache_queries_total{engine="0",model_name="policy"} 800.0\n'
      'vllm:prefix_cache_queries_total{engine="1",model_name="policy"} 10.0\n'
      'vllm:cache_config_info{block_size="128",kv_cache_dtype_skip_layers="[]"} 1.0\n')
  sampler = VLLMSampler(VLLMOptions(url=fake.url))
  assert sampler.prefix_cache() == {"queries": 810.0, "hits": 640.0}


@pytest.mark.parametrize("enabled, flag", [(True, "--enable-prefix-caching"),
                                           (False, "--no-enable-prefix-caching")])
def test_the_server_command_sets_prefix_caching(tmp_path, enabled, flag):
  server = VLLMServer(ServerOptions(model=str(tmp_path), enable_prefix_caching=enabled))
  command = server.command(8000)
  assert flag in command and command.count("--enable-prefix-caching") == enabled


def test_load_weights_rejects_a_directory_without_safetensors(fake, tmp_path):
  with pytest.raises(ValueError, match=r"path: .* not a directory with \*\.safetensors"):
    VLLMSampler(VLLMOptions(url=fake.url)).load_weights(str(tmp_path))


def test_attaching_to_nothing_fails():
  dead = FakeServer()
  dead.close()
  with pytest.raises(SamplerError, match="no healthy vLLM server"):
    VLLMSampler(VLLMOptions(url=dead.url, health_timeout_s=0.5))


@pytest.mark.parametrize("kwargs, match", [
    ({}, "url, server: give exactly one"),
    ({"url": "http://x", "request_timeout_s": 0}, "request_timeout_s"),
    ({"url": "http://x", "max_concurrency": 0}, "max_concurrency"),
    ({"url": "http://x", "probe_prompts": ((),)}, "probe_prompts"),
    ({"url": "http://x", "handover_tolerance": -1.0}, "handover_tolerance"),
])
def test_invalid_options_are_rejected(kwargs, match):
  with pytest.raises(ValueError, match=match):
    VLLMOptions(**kwargs)


def test_invalid_server_options_are_rejected(tmp_path):
  with pytest.raises(ValueError, match="model: not a directory"):
    ServerOptions(model=str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="kv_cache_memory_bytes, gpu_memory_utilization"):
    ServerOptions(model=str(tmp_path), kv_cache_memory_bytes=None)
  with pytest.raises(ValueError, match="gpu_memory_utilization"):
    ServerOptions(model=str(tmp_path), gpu_memory_utilization=1.5)


@hypothesis.given(st.lists(st.lists(st.floats(-30, 0), min_size=1, max_size=6), min_size=1,
                           max_size=4),
                  st.integers(0, 5), st.floats(-1.0, 1.0))
def test_measure_gap_is_the_largest_difference_on_sampled_tokens(logprobs, prompt_len, shift):
  prompts = [[1] * (prompt_len + 1) for _ in logprobs]
  samples = [[Sample(tokens=[2] * len(lps), logprobs=lps, finish_reason="length")]
             for lps in logprobs]
  shifted = [[lp + shift * (k % 2) for k, lp in enumerate(lps)] for lps in logprobs]

  def teacher(seqs):  # prompt positions hold garbage that must never be read
    return [[99.0] * (prompt_len + 1) + s for s in shifted]
  gap = handover.measure_gap(prompts, samples, teacher)
  diffs = np.concatenate([np.abs(np.subtract(a, b)) for a, b in zip(shifted, logprobs)])
  np.testing.assert_allclose(gap.max_abs, diffs.max(), atol=1e-12)
  np.testing.assert_allclose(gap.mean_abs, diffs.mean(), atol=1e-12)
  assert gap.num_tokens == diffs.size


def test_measure_gap_rejects_teachers_of_the_wrong_shape_and_flags_non_finite():
  samples = [[Sample(tokens=[2, 3], logprobs=[-1.0, -2.0], finish_reason="length")]]
  with pytest.raises(ValueError, match="sequence 0 has 3 tokens but 2 log-probs"):
    handover.measure_gap([[1]], samples, lambda seqs: [[0.0, -1.0]])
  with pytest.raises(ValueError, match="returned 2 sequences for 1"):
    handover.measure_gap([[1]], samples, lambda seqs: [[0.0] * 3] * 2)
  gap = handover.measure_gap([[1]], samples, lambda seqs: [[0.0, float("nan"), -2.0]])
  assert gap.max_abs == float("inf") and gap.worst == (0, 1)
  with pytest.raises(handover.WeightMismatchError, match="differ by up to inf"):
    handover.check_gap(gap, 1e-3, "probe")


@pytest.mark.parametrize("kwargs, match", [
    ({"vocab_size": 4}, "vocab_size"),
    ({"num_kv_heads": 3}, "num_kv_heads: must divide"),
    ({"initializer_range": 0.0}, "initializer_range"),
    ({"num_layers": 0}, "num_layers"),
])
def test_tiny_model_spec_rejects_invalid_sizes(kwargs, match):
  with pytest.raises(ValueError, match=match):
    tiny_hf.TinyQwen3(**kwargs)


def test_the_server_command_sets_the_step_token_budget(tmp_path):
  """vLLM's CPU build dies on a seeded request whose prefill is split across steps: the
  trainer's servers get a token budget that holds a whole batch's prompts."""
  command = VLLMServer(ServerOptions(model=str(tmp_path), max_model_len=512,
                                     max_num_batched_tokens=4096)).command(8000)
  assert command[command.index("--max-num-batched-tokens") + 1] == "4096"
  assert "--max-num-batched-tokens" not in VLLMServer(ServerOptions(model=str(tmp_path))).command(1)
  with pytest.raises(ValueError, match="max_num_batched_tokens: must be >= max_model_len=512"):
    ServerOptions(model=str(tmp_path), max_model_len=512, max_num_batched_tokens=256)


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_between_phases_wakes_before_the_next_hand_over_or_batch(fake, tmp_path, level):
  """Issue 18: with `sampler.vllm_sleep_level`, the server sleeps while the trainer updates;
  a hand-over (or a batch) wakes it first, so weights are never loaded into a sleeping
  engine."""
  (tmp_path / "model.safetensors").write_bytes(b"")
  sampler = VLLMSampler(VLLMOptions(url=fake.url))
  sampler.generate([[1]], SamplingParams(max_new_tokens=1))
  sampler.sleep(level)
  sampler.sleep(level)  # already asleep: no second request
  sampler.load_weights(str(tmp_path), version=1)
  sampler.sleep(level)
  sampler.generate([[1]], SamplingParams(max_new_tokens=1))
  paths = [p for p, _ in fake.requests]
  assert paths == ["/v1/completions", f"/sleep?level={level}", "/wake_up", "/collective_rpc",
                   "/collective_rpc", "/reset_prefix_cache", f"/sleep?level={level}",
                   "/wake_up", "/v1/completions"]
  with pytest.raises(ValueError, match="sleep levels are 1 and 2"):
    sampler.sleep(3)
