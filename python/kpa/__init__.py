"""kpa: paged attention on Kokkos, for PyTorch.

Importing the package registers kpa's operators as ``torch.ops.kpa.*`` (vLLM's schemas:
paged_attention_v1, paged_attention_v2, reshape_and_cache, copy_blocks, swap_blocks) and
provides :mod:`kpa.vllm_ops`, functions with the signatures of ``vllm._custom_ops``. The
operators take CPU tensors, and CUDA tensors too when the package was built against a CUDA build
of kpa (``kpa.built_for_cuda``): those run on torch's current stream. CPU tensors run on kpa's
host back end in either build, on machines with or without a GPU. :mod:`kpa.vllm_backend` is
kpa as an attention backend of vLLM's engine, which vLLM finds through :mod:`kpa.vllm_plugin`.
"""

import importlib.util

import torch

_spec = importlib.util.find_spec("kpa._torch_ops")
if _spec is None or _spec.origin is None:
    raise ImportError("kpa: the compiled operators (kpa._torch_ops) are missing; install the package with "
                      "`pip install --no-build-isolation ./python` from kpa's source tree")
torch.ops.load_library(_spec.origin)

from . import vllm_ops  # noqa: E402  (needs the operators registered above)

__version__ = torch.ops.kpa.version()

#: Whether the operators take CUDA tensors (built against a CUDA build of kpa) as well as CPU ones.
built_for_cuda = torch.ops.kpa.built_for_cuda()


def host_isa() -> str:
    """The instruction set of the host kernels the operators run ("amx", "avx512vbmi", "avx512",
    "avx2" or "portable"; "amx-model" where KPA_HOST_ISA names it)."""
    return torch.ops.kpa.host_isa()


def paged_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                    query_start_loc=None, max_seq_len=None, alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0,
                    v_scale=1.0, logits_soft_cap=0.0, sliding_window=0, sinks=None) -> None:
    """Paged attention with the launch planner's choice of kernels and kpa's variants, in vLLM's
    cache layouts (``torch.ops.kpa.paged_attention``):

    - ``query_start_loc`` [num_seqs + 1] (vLLM's convention): sequence s has the query rows
      query_start_loc[s] to query_start_loc[s + 1], its last tokens, each attending the keys up to
      its own position; None: one query token per sequence (a decode step);
    - ``max_seq_len``: the longest of seq_lens (None: computed, which reads seq_lens on the host);
    - ``logits_soft_cap`` c > 0: logit = c tanh(logit / c); ``sliding_window`` W > 0: a query at
      position p attends keys p - W < j <= p; ``sinks`` [num_heads] float32: a logit per head that
      joins each softmax denominator.

    out and query are [num_tokens, num_heads, head_size]; the rest as in kpa.vllm_ops."""
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if seq_lens.numel() else 0
    torch.ops.kpa.paged_attention(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                                  query_start_loc, max_seq_len, alibi_slopes, kv_cache_dtype,
                                  vllm_ops._as_tensor(k_scale), vllm_ops._as_tensor(v_scale), logits_soft_cap,
                                  sliding_window, sinks)


def init_cuda() -> None:
    """Starts kpa's CUDA back end now (the first call on CUDA tensors does otherwise). Raises
    RuntimeError saying why it cannot (no GPU, or no driver: CPU tensors still run), and
    NotImplementedError on a package built for CPU tensors only."""
    torch.ops.kpa.init_cuda()


def set_check_indices(enabled: bool) -> bool:
    """Whether the operators check the indices they follow before launching (on by default):
    seq_lens and block_tables, slot_mapping, block_mapping, and that int64 tables fit int32. The
    check reads a result back on the host, so on CUDA tensors it waits for the GPU; turn it off to
    capture operators in a CUDA graph. Applies to every thread; returns the previous setting."""
    return torch.ops.kpa.set_check_indices(enabled)


__all__ = ["vllm_ops", "paged_attention", "host_isa", "init_cuda", "set_check_indices", "built_for_cuda",
           "__version__"]
