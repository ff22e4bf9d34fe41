"""The engine's bfloat16 logits equal transformers' bfloat16 logits, not merely point the same way.

See hf_parity.py for the tolerance: a fraction of transformers' own bf16-vs-float32 difference.
"""

from __future__ import annotations

import pytest
from hf_parity import FRACTION, SPEC, compare


@pytest.mark.slow
def test_bf16_engine_rounds_where_transformers_rounds(checkpoint_factory) -> None:
    parity = compare(checkpoint_factory(**SPEC))
    print(parity.row("cpu"))
    assert parity.delta > 1e-2  # bf16 really does differ from float32 here: the bound below means something
    assert parity.diff <= FRACTION * parity.delta, parity.row("cpu")
    assert parity.engine_tokens == parity.hf_tokens
