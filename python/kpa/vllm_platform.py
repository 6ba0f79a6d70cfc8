"""vLLM's CPU platform with kpa selectable as its attention backend (see :mod:`kpa.vllm_plugin`)."""

from vllm.platforms.cpu import CpuPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from kpa.vllm_plugin import BACKEND


def _selects_kpa(selected_backend) -> bool:
    return (selected_backend == AttentionBackendEnum.CUSTOM and AttentionBackendEnum.CUSTOM.is_overridden()
            and AttentionBackendEnum.CUSTOM.get_path() == BACKEND)


class KpaCpuPlatform(CpuPlatform):
    """vLLM's CPU platform, with ``CUSTOM`` (kpa) as a selectable attention backend: a model kpa
    cannot serve is refused with the reasons, never run by another backend instead."""

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if not _selects_kpa(selected_backend):
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        from kpa.vllm_backend import KpaAttentionBackend

        reasons = KpaAttentionBackend.validate_configuration(**attn_selector_config._asdict(), device_capability=None)
        if reasons:
            raise ValueError(f"kpa's attention backend cannot serve this model: {'; '.join(reasons)} "
                             f"({attn_selector_config})")
        return BACKEND
