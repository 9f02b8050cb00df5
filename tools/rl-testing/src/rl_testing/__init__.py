"""Test support shared by the rl-* packages (unpublished).

Import the submodules explicitly; this package module imports nothing, so
``import rl_testing.<submodule>`` costs only what that submodule needs:

* :mod:`rl_testing.strategies`: hypothesis strategies for group layouts, masks, rewards and turn
  ids (torch + hypothesis only).
* :mod:`rl_testing.tokenizer`: character-level and small BPE tokenizers built locally, with a chat
  template; needs the ``models`` extra (transformers, tokenizers).
* :mod:`rl_testing.models`: tiny random-weight Qwen2 / Llama causal LMs built from a config, plus
  save/load helpers; needs the ``models`` extra.
* :mod:`rl_testing.packaging`: package metadata checks used by every package's tests.
* :mod:`rl_testing.tolerance`: the one tolerance for comparisons of different kernels or
  reduction orders, derived from the dtype and the size of the reduction (torch only).
* :mod:`rl_testing.routing`: recorded mixture-of-experts routes against a model's own top-k,
  near ties excepted (torch only).

Neither :mod:`rl_testing` nor :mod:`rl_testing.strategies` imports transformers or tokenizers, so
packages without the ``models`` extra (rl-advantages, rl-losses, rl-kernels) can use them.
"""

__all__: list[str] = []
