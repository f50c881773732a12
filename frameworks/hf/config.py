"""The ``hf`` framework's schema (``conf/framework/hf.yaml`` extends ``schema/framework/hf``).

Light on purpose (dataclasses only): registering the schemas must not import transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_exp.core.config import FrameworkConf
from pretrain_exp.core.errors import ConfigError

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass
class HFConf(FrameworkConf):
    """``framework=hf``: any HF causal LM trained with ``transformers.Trainer``."""

    name: str = "hf"
    attn_implementation: str = "sdpa"  #: HF attention kernel (one of :data:`ATTN_IMPLEMENTATIONS`)

    def validate(self, key: str = "framework") -> None:
        """:raises ConfigError: (``<key>.attn_implementation``) for an unknown attention kernel."""
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ConfigError(f"{key}.attn_implementation", f"unknown {self.attn_implementation!r}; "
                              f"allowed: {list(ATTN_IMPLEMENTATIONS)}")
