"""Presets against the published model cards, HF config conversion, sharding rules."""

import pytest
import transformers
from flax import nnx
from jax.sharding import PartitionSpec as P

from tirjax.models import config, decoder, hf_config
from tirjax.sharding import DEFAULT_RULES, logical_to_spec


def param_counts(cfg):
  """(total, non-embedding) parameter counts of the abstract model (no memory used)."""
  model = decoder.abstract(cfg)
  total = decoder.num_params(model)
  embedding = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
  return total, total - embedding


# Published sizes: the "Number of Parameters (Non-Embedding)" lines of the Qwen model cards
# (huggingface.co/Qwen/<name>), and the exact count of Llama 3.1 8B's safetensors.
@pytest.mark.parametrize("name, total_b, non_embedding_b", [
    ("qwen3_0p6b", None, 0.44),
    ("qwen3_1p7b", None, 1.4),
    ("qwen3_4b", None, 3.6),
    ("qwen3_8b", 8.2, 6.95),
    ("qwen2p5_7b", 7.61, 6.53),
])
def test_qwen_presets_match_model_cards(name, total_b, non_embedding_b):
  """Within one unit of the card's last digit (the cards round some sizes, truncate others)."""
  def close(count, published):
    return abs(count / 1e9 - published) < 10.0**-len(str(published).split(".")[1])

  total, non_embedding = param_counts(config.preset(name))
  assert close(non_embedding, non_embedding_b)
  assert total_b is None or close(total, total_b)


def test_llama3_8b_preset_has_the_published_parameter_count():
  assert param_counts(config.preset("llama3_8b"))[0] == 8_030_261_248


@pytest.mark.parametrize("name", sorted(config.PRESETS))
def test_presets_round_trip_through_hf_config(name):
  cfg = config.preset(name)
  hf = hf_config.config_to_hf(cfg, torch_dtype=cfg.param_dtype)
  assert hf_config.config_from_hf(hf) == cfg
  # transformers reads the same architecture from it.
  tf = transformers.AutoConfig.for_model(**hf)
  assert (tf.hidden_size, tf.num_hidden_layers, tf.num_key_value_heads, tf.vocab_size) == (
      cfg.hidden_size, cfg.num_layers, cfg.num_kv_heads, cfg.vocab_size)
  assert tf.rope_parameters["rope_theta"] == cfg.rope_theta
  assert tf.rope_parameters["rope_type"] == ("llama3" if cfg.rope_scaling else "default")


def test_transformers5_config_layout_is_read():
  hf = {"model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "dtype": "bfloat16", "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5,
                                                   "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64}}
  cfg = hf_config.config_from_hf(hf)
  assert cfg.rope_theta == 5e5 and cfg.rope_scaling.factor == 8.0
  assert cfg.head_dim == 8 and cfg.param_dtype == "bfloat16"
  assert not cfg.tie_word_embeddings


def test_export_config_keeps_base_keys():
  base = {"bos_token_id": 1, "eos_token_id": [2, 3], "rope_parameters": {"rope_theta": 1.0},
          "dtype": "float32", "model_type": "qwen3"}
  hf = hf_config.config_to_hf(config.tiny(), torch_dtype="bfloat16", base=base)
  assert hf["eos_token_id"] == [2, 3] and hf["bos_token_id"] == 1
  assert "rope_parameters" not in hf and "dtype" not in hf
  assert hf["torch_dtype"] == "bfloat16" and hf["architectures"] == ["Qwen3ForCausalLM"]


def test_tiny_takes_a_vocabulary_size():
  cfg = config.preset("tiny", vocab_size=700)
  model = decoder.abstract(cfg)
  assert model.embed.shape == (700, cfg.hidden_size)


@pytest.mark.parametrize("change, match", [
    (dict(family="gpt2"), "family"),
    (dict(num_kv_heads=3), "num_heads"),
    (dict(head_dim=15), "head_dim"),
    (dict(param_dtype="float16"), "param_dtype"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps"),
])
def test_invalid_config_names_the_option(change, match):
  with pytest.raises(ValueError, match=match):
    config.tiny(**change)
  with pytest.raises(ValueError, match="preset"):
    config.preset("qwen3_70b")
  with pytest.raises(ValueError, match="low_freq_factor"):
    config.RopeScaling(factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
                       original_max_position_embeddings=8)


def test_every_parameter_carries_logical_axis_names():
  names = {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "layers"}
  for cfg in (config.tiny(family="qwen3"), config.tiny(family="qwen2"),
              config.tiny(family="llama", tie_word_embeddings=False)):
    state = nnx.state(decoder.abstract(cfg), nnx.Param)
    for path, var in nnx.to_flat_state(state):
      axes = var.get_metadata()["out_sharding"]
      assert len(axes) == len(var.get_value().shape) and set(axes) <= names, path
      assert (axes[0] == "layers") == (path[0] == "layers"), path


def test_logical_to_spec_rules():
  rules = DEFAULT_RULES
  mesh = {"data": 2, "fsdp": 2, "tensor": 2}
  assert logical_to_spec(("vocab", "embed"), rules, mesh) == P("tensor", "fsdp")
  # batch takes data and fsdp, so an activation's embed stays replicated.
  assert logical_to_spec(("batch", "length", "embed"), rules, mesh) == P(("data", "fsdp"),
                                                                         None, None)
  # Mesh axes the mesh lacks are dropped; indivisible dimensions stay replicated.
  assert logical_to_spec(("batch", "mlp"), rules, {"data": 4}) == P("data", None)
  assert logical_to_spec(("kv_heads", "embed"), rules, mesh, shape=(3, 8)) == P(None, "fsdp")
  assert logical_to_spec(("layers", None), rules, mesh) == P(None, None)
