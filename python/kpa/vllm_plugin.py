"""vLLM's plugin entry points for kpa (declared in the package's metadata, so installing ``kpa``
beside vLLM is enough; tested with vLLM 0.32):

- ``vllm.general_plugins``: :func:`register` makes vLLM's ``CUSTOM`` attention backend kpa's
  (:class:`kpa.vllm_backend.KpaAttentionBackend`), in every vLLM process (the engine's, and each
  tensor-parallel worker's);
- ``vllm.platform_plugins``: :func:`cpu_platform` gives vLLM's CPU build
  :class:`kpa.vllm_platform.KpaCpuPlatform`,
  vLLM's own CPU platform except that it honours ``--attention-backend CUSTOM`` (vLLM's CPU
  platform serves every model with its own backend whatever is asked).

Select kpa with ``vllm serve MODEL --attention-backend CUSTOM`` or ``LLM(..., attention_backend=
"CUSTOM")``; without it vLLM runs as it would without kpa.
"""

BACKEND = "kpa.vllm_backend.KpaAttentionBackend"
CPU_PLATFORM = "kpa.vllm_platform.KpaCpuPlatform"


def register() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)


def cpu_platform() -> str | None:
    """kpa's CPU platform wherever vLLM would choose its CPU platform."""
    from vllm.platforms import cpu_platform_plugin

    return CPU_PLATFORM if cpu_platform_plugin() is not None else None
