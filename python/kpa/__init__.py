"""kpa: paged attention on Kokkos, for PyTorch.

Importing the package registers kpa's operators as ``torch.ops.kpa.*`` (vLLM's schemas:
paged_attention_v1, paged_attention_v2, reshape_and_cache, copy_blocks, swap_blocks) and
provides :mod:`kpa.vllm_ops`, functions with the signatures of ``vllm._custom_ops``. The
operators take CPU tensors, and CUDA tensors too when the package was built against a CUDA build
of kpa (``kpa.built_for_cuda``): those run on torch's current stream.
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
    """The instruction set of the host kernels the operators run ("avx512vbmi", "avx512", "avx2" or
    "portable")."""
    return torch.ops.kpa.host_isa()


def set_check_indices(enabled: bool) -> bool:
    """Whether the operators check the indices they follow before launching (on by default):
    seq_lens and block_tables, slot_mapping, block_mapping, and that int64 tables fit int32. The
    check reads a result back on the host, so on CUDA tensors it waits for the GPU; turn it off to
    capture operators in a CUDA graph. Applies to every thread; returns the previous setting."""
    return torch.ops.kpa.set_check_indices(enabled)


__all__ = ["vllm_ops", "host_isa", "set_check_indices", "built_for_cuda", "__version__"]
