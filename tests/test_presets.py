"""Real models' attention facts and cache sizes."""

import pytest

from modern_block import (
    PRESETS,
    cache_size,
    kv_cache_bytes_per_token,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


def test_presets_and_sliding_windows():
    assert cache_size("Llama 3 8B", 1000, batch=2, dtype="fp32") == 2 * 1000 * kv_cache_bytes_per_token(32, 8, 128, 4)
    oss = PRESETS["gpt-oss-120b"]
    per_layer = 2 * 8 * 64 * 2
    assert cache_size(oss, 131_072) == per_layer * (18 * 131_072 + 18 * 128)
    assert cache_size(oss, 100) == oss.bytes_per_token() * 100  # below the window every layer holds everything
    with pytest.raises(ValueError, match="preset must be one of"):
        cache_size("GPT-5", 10)
    with pytest.raises(ValueError, match="dtype must be one of"):
        cache_size("Llama 3 8B", 10, dtype="int3")
