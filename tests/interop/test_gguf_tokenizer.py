"""The tokenizer rebuilt from a GGUF file's metadata (modern_block/interop/gguf_tokenizer.py), on a made-up
vocabulary small enough to check by hand: merges in order, the digit split of SmolLM2's pre-tokenizer, special
tokens kept whole, the named special ids, and each damaged or unsupported field refused by name. The real
SmolLM2 file's tokenizer is checked against its text in test_gguf.py."""

from types import SimpleNamespace

import pytest

from modern_block.interop.gguf_tokenizer import gguf_tokenizer

TOKENS = ["a", "b", "ab", "Ġ", "Ġab", "1", "2", "12", "<|im_end|>", "<|endoftext|>"]
TYPES = [1, 1, 1, 1, 1, 1, 1, 1, 3, 3]  # 3: control (special) tokens


def metadata(**changes):
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": TOKENS,
          "tokenizer.ggml.merges": ["a b", "Ġ ab", "1 2"], "tokenizer.ggml.token_type": TYPES,
          "tokenizer.ggml.bos_token_id": 9, "tokenizer.ggml.eos_token_id": 8,
          "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"}
    md.update(changes)
    return SimpleNamespace(metadata={k: v for k, v in md.items() if v is not None})


def test_merges_special_tokens_and_named_ids():
    tok = gguf_tokenizer(metadata())
    assert tok.encode("ab ab") == [2, 4]  # "a b" merged, then "Ġ ab"
    assert tok.encode("ab<|im_end|>ab") == [2, 8, 2]  # a control token stays whole
    assert tok.decode([2, 4]) == "ab ab"
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id) == ("<|endoftext|>", "<|im_end|>", 8)
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False) == "ab<|im_end|>"


def test_the_pre_tokenizer_decides_whether_digits_merge():
    assert gguf_tokenizer(metadata()).encode("12") == [5, 6]  # smollm: every digit apart
    assert gguf_tokenizer(metadata(**{"tokenizer.ggml.pre": "gpt-2"})).encode("12") == [7]
    assert gguf_tokenizer(metadata(**{"tokenizer.ggml.pre": None})).encode("12") == [7]  # default: GPT-2's split


@pytest.mark.parametrize("changes,message", [
    ({"tokenizer.ggml.model": None}, "the metadata field tokenizer.ggml.model is missing"),
    ({"tokenizer.ggml.merges": None}, "the metadata field tokenizer.ggml.merges is missing"),
    ({"tokenizer.ggml.model": "llama"}, r"tokenizer.ggml.model='llama': the course rebuilds byte-level BPE"),
    ({"tokenizer.ggml.pre": "qwen2"}, r"tokenizer.ggml.pre='qwen2': the course knows the splits"),
    ({"tokenizer.ggml.token_type": TYPES[:-1]}, "token_type has 9 entries for 10 tokens: the file is damaged"),
])
def test_unusable_metadata_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        gguf_tokenizer(metadata(**changes))
