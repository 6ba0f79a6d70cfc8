"""kpa: paged attention on Kokkos, for PyTorch.

Importing the package registers kpa's operators as ``torch.ops.kpa.*`` (vLLM's schemas:
paged_attention_v1, paged_attention_v2, reshape_and_cache, copy_blocks, swap_blocks) and
provides :mod:`kpa.vllm_ops`, functions with the signatures of ``vllm._custom_ops``.
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


def host_isa() -> str:
    """The instruction set of the host kernels the operators run ("avx512vbmi", "avx512", "avx2" or
    "portable")."""
    return torch.ops.kpa.host_isa()


__all__ = ["vllm_ops", "host_isa", "__version__"]
