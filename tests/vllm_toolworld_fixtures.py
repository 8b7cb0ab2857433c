"""The session fixture of the toolworld vLLM tests, as a pytest plugin: test modules name it
in `pytest_plugins`, so that they share one server.

`toolworld` builds the toolworld tokenizer and the `tiny` tirjax model over its vocabulary
(`vllm_toolworld.tiny_model`), exports it with `export_hf` in float32 with the tokenizer files,
and serves it with one vLLM server. Tests hand over the weights they need first
(`Toolworld.use`), so they do not depend on each other's order; the trainer test loads its own.
"""

import pytest
import transformers

from tests import vllm_support as support
from tests.vllm_toolworld import MAX_MODEL_LEN, Toolworld, tiny_model
from tirjax.env.toolworld import build_tokenizer
from tirjax.models.hf_io import export_hf
from tirjax.sampling.vllm import VLLMOptions, VLLMSampler
from tirjax.sampling.vllm_server import ServerOptions


@pytest.fixture(scope="session")
def toolworld(tmp_path_factory):
  root = tmp_path_factory.mktemp("vllm_toolworld")
  tokenizer_dir = str(build_tokenizer(root / "tokenizer"))
  tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
  model = tiny_model(len(tokenizer))
  model_dir = export_hf(model, str(root / "start"), source_dir=tokenizer_dir, dtype="float32")
  sampler = VLLMSampler(VLLMOptions(server=ServerOptions(
      model=model_dir, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=support.KV_CACHE_BYTES)))
  yield Toolworld(tokenizer=tokenizer, tokenizer_dir=tokenizer_dir, model=model,
                  root=str(root), sampler=sampler)
  tag = sampler.server.tag
  sampler.close()
  assert support.tagged_pids(tag) == []
