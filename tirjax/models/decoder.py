"""The decoder-only policy model (Flax NNX), layers stacked and scanned.

Inputs are right-padded rows `tokens [B, L]` with a validity mask `token_valid [B, L]`.
Positions are the running count of valid tokens (`cumsum(valid) − 1`), and a query attends to
keys that are valid and not in its future. `packed_hidden` runs packed forests instead (rows
sharing prefixes laid out once, `tirjax.models.tree_attention`). Logits at padding positions
are finite but meaningless, whatever the padding ids.

The `num_layers` decoder layers are created with `nnx.vmap` (every layer parameter gains a
leading "layers" axis) and applied with `jax.lax.scan`, so compile time does not grow with
depth.

Activations are constrained by logical names with the `rules` given at construction (the
config's `ShardingOptions.rules`; see `tirjax.sharding`), a no-op unless a mesh is set with
`jax.set_mesh`. The rules are static attributes of the module, so a jitted function of the
model recompiles when they change.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from tirjax.models.config import ModelConfig
from tirjax.models.layers import DecoderLayer, RMSNorm, normal, rope_tables
from tirjax.models.tree_attention import TreeMask
from tirjax.sharding import DEFAULT_RULES, Rules, constrain


class Decoder(nnx.Module):
  """Embedding → scanned `DecoderLayer`s → final RMSNorm → (tied or untied) unembedding."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, rules: Rules = DEFAULT_RULES):
    self.config = cfg = config
    self.rules = rules
    self.embed = normal(rngs, cfg, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"))

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make_layers(rngs):
      return DecoderLayer(cfg, rules, rngs=rngs)

    self.layers = make_layers(rngs)
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ("embed",), cfg.param_dtype)
    if not cfg.tie_word_embeddings:
      self.lm_head = normal(rngs, cfg, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"))

  @property
  def unembedding(self) -> jax.Array:
    """`[vocab, embed]`: logits = hidden · unembeddingᵀ."""
    return (self.embed if self.config.tie_word_embeddings else self.lm_head)[...]

  def hidden(self, tokens: jax.Array, token_valid: Optional[jax.Array] = None) -> jax.Array:
    """Final normalised hidden states `[B, L, hidden_size]` in `config.dtype`."""
    if token_valid is None:
      token_valid = jnp.ones(tokens.shape, bool)
    token_valid = token_valid.astype(bool)
    positions = jnp.maximum(jnp.cumsum(token_valid, axis=1) - 1, 0)
    length = tokens.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    return self._layers(tokens, token_valid, positions, causal[None] & token_valid[:, None, :])

  def packed_hidden(self, tokens: jax.Array, tree: TreeMask) -> jax.Array:
    """Final hidden states `[S, N, hidden_size]` of packed forests `tokens [S, N]`: each
    token's is the one it has in every padded row that carries it (`tree_attention`)."""
    return self._layers(tokens, tree.valid, tree.positions, tree)

  def _layers(self, tokens, token_valid, positions, mask) -> jax.Array:
    cfg = self.config
    cos, sin = rope_tables(cfg, positions, cfg.dtype)
    x = self.embed_tokens(tokens, token_valid)
    graphdef, layer_state = nnx.split(self.layers)

    def body(x, state):
      return nnx.merge(graphdef, state)(x, cos, sin, mask), None

    if cfg.remat:
      body = jax.checkpoint(body, prevent_cse=False)
    x, _ = jax.lax.scan(body, x, layer_state)
    return self.final_norm(x)

  def embed_tokens(self, tokens: jax.Array, token_valid: jax.Array) -> jax.Array:
    """Embeddings `[B, L, hidden_size]` in `config.dtype`; padding reads row 0."""
    # Padding ids may be anything (e.g. -1); they must not reach the lookup as NaN rows.
    tokens = jnp.where(token_valid, tokens, 0)
    x = jnp.take(self.embed[...], tokens, axis=0, mode="clip").astype(self.config.dtype)
    return constrain(x, ("batch", "length", "embed"), self.rules)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """float32 logits `[B, L, vocab]` of hidden states `[B, L, hidden_size]`."""
    w = self.unembedding.astype(hidden.dtype)
    out = jnp.einsum("bld,vd->blv", hidden, w, preferred_element_type=jnp.float32)
    return constrain(out, ("batch", "length", "vocab"), self.rules)

  def __call__(self, tokens: jax.Array, token_valid: Optional[jax.Array] = None) -> jax.Array:
    """float32 logits `[B, L, vocab]`. For log-probs of long batches use `token_logprobs`."""
    return self.logits(self.hidden(tokens, token_valid))


def init(config: ModelConfig, seed: int = 0, *, rules: Rules = DEFAULT_RULES) -> Decoder:
  """A randomly initialised model (HF-style init: normal(init_std), norms 1, biases 0).

  Initialised inside one jitted function: run eagerly, every initialiser would compile
  separately."""
  return nnx.jit(lambda: Decoder(config, rngs=nnx.Rngs(params=seed), rules=rules))()


def abstract(config: ModelConfig, *, rules: Rules = DEFAULT_RULES) -> Decoder:
  """The model with `jax.ShapeDtypeStruct` leaves: shapes and metadata, no memory."""
  return nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(params=0), rules=rules))


def num_params(model: Decoder) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
