"""A vLLM worker extension, imported inside the vLLM server (`--worker-extension-cls`).

This directory holds only this module and goes on the server's PYTHONPATH: it runs in vLLM's
environment, where tirjax itself is not importable (and `tirjax/sampling/vllm.py` would shadow
the `vllm` package).

Why: vLLM's in-place `reload_weights` processes a tied parameter through one of its owners
only (a documented limitation of its layerwise reload). On CPU, processing prepacks a linear
layer's weight into a oneDNN handle, so after a reload the LM head of a model with tied
embeddings (Qwen3 up to 4B) keeps computing logits from the *old* embedding matrix.
"""

import torch


class TirjaxWorkerExtension:
  """Methods added to vLLM's worker, called through `POST /collective_rpc`."""

  def refresh_tied_weights(self) -> list:
    """Re-processes every module whose weight is shared with another; returns their names."""
    owners = {}
    for name, module in self.model_runner.get_model().named_modules():
      weight = getattr(module, "weight", None)
      if isinstance(weight, torch.Tensor) and weight.numel() and hasattr(module, "quant_method"):
        owners.setdefault(weight.data_ptr(), []).append((name, module))
    refreshed = []
    for group in owners.values():
      if len(group) > 1:
        for name, module in group:
          module.quant_method.process_weights_after_loading(module)
          refreshed.append(name)
    return refreshed
