"""Hugging Face interchange: logits parity with transformers' PyTorch models, export round trip,
sharded checkpoints, tied/untied embeddings, and the errors for mismatching checkpoints."""

import json
import os
import shutil
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from tirjax import sharding
from tirjax.models import config, decoder, hf_config
from tirjax.models.hf_io import CheckpointMismatch, export_hf, load_hf

V, L = 128, 24
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
FAMILIES = {
    # name: (transformers class, config); rope scaling with a short original context so that
    # all three frequency bands of the llama3 rule (kept, smoothed, divided) occur.
    "qwen3_tied": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        head_dim=16, tie_word_embeddings=True, **COMMON)),
    "qwen3_untied": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        head_dim=24, tie_word_embeddings=False, **COMMON)),
    "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
        tie_word_embeddings=False, **COMMON)),
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig(
        rope_theta=10000.0, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False, **COMMON)),
}
TOKENIZER_FILES = {"tokenizer.json": '{"version": "1.0"}', "tokenizer_config.json": "{}",
                   "chat_template.jinja": "{{ messages }}"}


def randomise(model: torch.nn.Module, seed: int) -> None:
  """Non-trivial norms and biases (HF initialises them to 1 and 0)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.2 * noise if "norm" in name else (0.2 if p.ndim > 1 else 0.1) * noise)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name → (directory of a saved transformers model, the torch model)."""
  out = {}
  for seed, (name, (cls, cfg)) in enumerate(FAMILIES.items()):
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    randomise(model, seed)
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    for file, text in TOKENIZER_FILES.items():
      with open(os.path.join(path, file), "w") as f:
        f.write(text)
    out[name] = (path, model)
  return out


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, V, size=(3, L))
  valid = np.arange(L)[None] < np.array([[L], [13], [1]])
  tokens = np.where(valid, tokens, 0)
  return tokens, valid


def torch_logits(model, tokens, valid):
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens),
                 attention_mask=torch.tensor(valid.astype(np.int64))).logits.float().numpy()


_forward = nnx.jit(lambda m, t, v: m(t, v))


def jax_logits(model, tokens, valid):
  return np.asarray(_forward(model, jnp.asarray(tokens), jnp.asarray(valid)))


def max_diff(a, b, valid):
  return float(np.abs(a - b)[valid].max())


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_transformers_then_export_round_trip(name, checkpoints, batch, tmp_path):
  path, torch_model = checkpoints[name]
  tokens, valid = batch
  want = torch_logits(torch_model, tokens, valid)
  model = load_hf(path)
  assert model.config.family == torch_model.config.model_type
  assert model.config.tie_word_embeddings == torch_model.config.tie_word_embeddings
  assert max_diff(jax_logits(model, tokens, valid), want, valid) <= 1e-4

  out = export_hf(model, str(tmp_path / "export"), source_dir=path)
  reloaded = type(torch_model).from_pretrained(out).eval()
  assert max_diff(torch_logits(reloaded, tokens, valid), want, valid) <= 1e-4
  for file, text in TOKENIZER_FILES.items():
    with open(os.path.join(out, file)) as f:
      assert f.read() == text
  assert os.path.exists(os.path.join(out, "generation_config.json"))
  names = set(load_file(os.path.join(out, "model.safetensors")))
  assert ("lm_head.weight" in names) == (not model.config.tie_word_embeddings)


def test_llama3_rope_scaling_is_applied(checkpoints, batch):
  """Without the scaling the same weights give different logits: the parity test sees it."""
  path, torch_model = checkpoints["llama"]
  tokens, valid = batch
  unscaled = load_hf(path, rope_scaling=None)
  assert max_diff(jax_logits(unscaled, tokens, valid),
                  torch_logits(torch_model, tokens, valid), valid) > 1e-2


def test_sharded_checkpoint_with_index(checkpoints, batch, tmp_path):
  _, torch_model = checkpoints["qwen2"]
  torch_model.save_pretrained(tmp_path, max_shard_size="40KB")
  with open(tmp_path / "model.safetensors.index.json") as f:
    assert len(set(json.load(f)["weight_map"].values())) > 2
  tokens, valid = batch
  model = load_hf(str(tmp_path))
  assert max_diff(jax_logits(model, tokens, valid),
                  torch_logits(torch_model, tokens, valid), valid) <= 1e-4

  out = export_hf(model, str(tmp_path / "export"), max_shard_bytes=30_000)
  with open(os.path.join(out, "model.safetensors.index.json")) as f:
    index = json.load(f)
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  assert sorted(f for f in os.listdir(out) if f.endswith(".safetensors")) == files
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert max_diff(torch_logits(reloaded, tokens, valid),
                  torch_logits(torch_model, tokens, valid), valid) <= 1e-4
  again = load_hf(out)
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
    np.testing.assert_array_equal(a, b)


def test_tied_checkpoint_may_carry_lm_head(checkpoints, tmp_path):
  """Some tied checkpoints also store lm_head.weight; it is skipped, as vLLM does."""
  path, _ = checkpoints["qwen3_tied"]
  shutil.copytree(path, tmp_path / "ckpt")
  file = tmp_path / "ckpt" / "model.safetensors"
  tensors = load_file(file)
  tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
  save_file(tensors, file, metadata={"format": "pt"})
  model = load_hf(str(tmp_path / "ckpt"))
  np.testing.assert_array_equal(model.unembedding, tensors["model.embed_tokens.weight"])


def test_bfloat16_load_and_export(checkpoints, batch, tmp_path):
  path, torch_model = checkpoints["qwen3_untied"]
  model = load_hf(path, param_dtype="bfloat16", dtype="bfloat16")
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(model)))
  f32 = load_hf(path)
  np.testing.assert_array_equal(model.embed[...], f32.embed[...].astype(jnp.bfloat16))
  tokens, valid = batch
  want = torch_logits(torch_model, tokens, valid)
  assert max_diff(jax_logits(model, tokens, valid), want, valid) < 0.1 * np.abs(want).max()

  out = export_hf(f32, str(tmp_path / "bf16"), dtype="bfloat16")
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["torch_dtype"] == "bfloat16"
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert reloaded.dtype == torch.bfloat16
  np.testing.assert_array_equal(
      reloaded.model.embed_tokens.weight.detach().float().numpy(),
      np.asarray(f32.embed[...].astype(jnp.bfloat16).astype(jnp.float32)))


def test_load_onto_a_mesh(checkpoints, batch):
  path, torch_model = checkpoints["qwen3_untied"]
  mesh = sharding.make_mesh(sharding.ShardingOptions(mesh=(("data", 2), ("fsdp", 2),
                                                           ("tensor", 2))))
  model = load_hf(path, mesh=mesh)
  assert model.embed[...].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  q = model.layers.attn.q_proj[...]
  assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
  tokens, valid = batch
  with jax.set_mesh(mesh):
    got = jax_logits(model, tokens, valid)
  assert max_diff(got, torch_logits(torch_model, tokens, valid), valid) <= 1e-4


def test_loading_reads_one_tensor_at_a_time(checkpoints, monkeypatch):
  """Each tensor is read once, and a read tensor is released before the next is read."""
  from tirjax.models import hf_io

  reads, alive, most_alive = [], [], []

  class Handle:
    def __init__(self, handle):
      self.handle = handle

    def get_slice(self, name):
      return self.handle.get_slice(name)

    def get_tensor(self, name):
      x = self.handle.get_tensor(name)
      reads.append(name)
      alive.append(weakref.ref(x))
      most_alive.append(sum(r() is not None for r in alive))
      return x

    def keys(self):
      return self.handle.keys()

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      pass

  real = hf_io.safe_open
  monkeypatch.setattr(hf_io, "safe_open", lambda *a, **k: Handle(real(*a, **k)))
  load_hf(checkpoints["qwen2"][0])
  assert len(reads) == len(set(reads)) == 3 + 2 * 12
  assert max(most_alive) == 1


# Errors ------------------------------------------------------------------------------------


def copy_checkpoint(checkpoints, name, dest):
  shutil.copytree(checkpoints[name][0], dest)
  return dest / "model.safetensors"


def test_missing_tensor_is_named(checkpoints, tmp_path):
  file = copy_checkpoint(checkpoints, "llama", tmp_path / "c")
  tensors = load_file(file)
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, file, metadata={"format": "pt"})
  with pytest.raises(CheckpointMismatch, match=r"/c: missing.*model\.layers\.1\.mlp\.up_proj"):
    load_hf(str(tmp_path / "c"))


def test_unexpected_tensor_is_named_with_its_file(checkpoints, tmp_path):
  file = copy_checkpoint(checkpoints, "llama", tmp_path / "c")
  tensors = load_file(file)
  tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
  save_file(tensors, file, metadata={"format": "pt"})
  with pytest.raises(CheckpointMismatch,
                     match=r"model\.safetensors: unexpected.*self_attn\.q_proj\.bias"):
    load_hf(str(tmp_path / "c"))


def test_wrong_shape_is_named_with_its_file(checkpoints, tmp_path):
  copy_checkpoint(checkpoints, "qwen2", tmp_path / "c")
  cfg = hf_config.read(str(tmp_path / "c"))
  cfg["intermediate_size"] = 80
  with open(tmp_path / "c" / "config.json", "w") as f:
    json.dump(cfg, f)
  with pytest.raises(CheckpointMismatch, match=r"model\.safetensors: tensor "
                     r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(96, 64\)"):
    load_hf(str(tmp_path / "c"))


def test_index_naming_an_absent_shard(checkpoints, tmp_path):
  checkpoints["qwen2"][1].save_pretrained(tmp_path, max_shard_size="40KB")
  os.remove(tmp_path / "model-00002-of-" f"{len(list(tmp_path.glob('model-*'))):05d}.safetensors")
  with pytest.raises(CheckpointMismatch, match="does not exist"):
    load_hf(str(tmp_path))


@pytest.mark.parametrize("change, match", [
    ({"model_type": "mistral"}, "unsupported model_type 'mistral'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": True}, "sliding-window"),
])
def test_unsupported_configs_are_named(checkpoints, tmp_path, change, match):
  copy_checkpoint(checkpoints, "llama", tmp_path / "c")
  cfg = hf_config.read(str(tmp_path / "c"))
  cfg.pop("rope_parameters", None)
  cfg.update(change)
  with open(tmp_path / "c" / "config.json", "w") as f:
    json.dump(cfg, f)
  with pytest.raises(hf_config.UnsupportedConfig, match=match) as err:
    load_hf(str(tmp_path / "c"))
  assert "config.json" in str(err.value)


def test_directory_without_weights(tmp_path):
  with open(tmp_path / "config.json", "w") as f:
    json.dump(hf_config.config_to_hf(config.tiny(), torch_dtype="float32"), f)
  with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
    load_hf(str(tmp_path))


def test_export_never_overwrites_silently(tmp_path):
  model = decoder.init(config.tiny(vocab_size=64))
  dest = tmp_path / "out"
  dest.mkdir()
  (dest / "keep.txt").write_text("user data")
  with pytest.raises(FileExistsError, match="not empty"):
    export_hf(model, str(dest))
  assert os.listdir(dest) == ["keep.txt"]
  assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary directory left behind
  export_hf(model, str(dest), overwrite=True)
  assert sorted(os.listdir(dest)) == ["config.json", "model.safetensors"]
  assert sorted(os.listdir(tmp_path)) == ["out"]
  (tmp_path / "empty").mkdir()
  export_hf(model, str(tmp_path / "empty"))  # an empty directory is fine


def test_failed_export_leaves_destination_untouched(tmp_path, monkeypatch):
  model = decoder.init(config.tiny(vocab_size=64))
  dest = tmp_path / "out"
  export_hf(model, str(dest))
  before = (dest / "model.safetensors").read_bytes()

  def fail(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr("tirjax.models.hf_io.save_file", fail)
  with pytest.raises(OSError, match="disk full"):
    export_hf(model, str(dest), overwrite=True)
  assert (dest / "model.safetensors").read_bytes() == before
  assert sorted(os.listdir(tmp_path)) == ["out"]
