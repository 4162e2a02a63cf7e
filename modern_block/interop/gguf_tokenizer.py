"""The tokenizer stored inside a GGUF file, rebuilt with the ``tokenizers`` library.

A byte-level BPE tokenizer (``tokenizer.ggml.model = "gpt2"``: GPT-2, SmolLM2, Llama 3, Qwen) is three things:

* how text is split before merging (``tokenizer.ggml.pre``): SmolLM2's "smollm" rule cuts every digit apart,
  then applies GPT-2's split into words, numbers, punctuation runs and spaces; the bytes of each piece are
  spelled with GPT-2's printable byte alphabet (a space is "Ġ", a newline "Ċ");
* the vocabulary (``tokenizer.ggml.tokens``: token string -> id) and the merge rules in priority order
  (``tokenizer.ggml.merges``: "Ġ t" means: join "Ġ" and "t" wherever they meet, before any later rule);
* the special tokens (``tokenizer.ggml.token_type`` 3 = control: ``<|im_start|>``, ``<|im_end|>``, ...), kept
  whole, and the ids of the beginning/end-of-text tokens; plus the chat template (``tokenizer.chat_template``, a
  Jinja template that wraps a conversation in those special tokens).

The result is a ``transformers.PreTrainedTokenizerFast`` so that ``apply_chat_template`` renders the file's own
template; transformers and tokenizers are imported when this runs.
"""

CONTROL = 3  # llama.cpp's token type for special tokens
PRE_TOKENIZERS = {  # tokenizer.ggml.pre -> does the split cut every digit apart before GPT-2's split?
    "smollm": True,
    "gpt-2": False,
    "default": False,
}


def _need(metadata: dict, key: str):
    if key not in metadata:
        raise ValueError(f"the metadata field {key} is missing: this file carries no usable tokenizer")
    return metadata[key]


def gguf_tokenizer(gf):
    """A ``PreTrainedTokenizerFast`` from a ``GGUFFile``'s vocabulary, merges, special tokens and chat template."""
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    md = gf.metadata
    kind = _need(md, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"tokenizer.ggml.model={kind!r}: the course rebuilds byte-level BPE tokenizers ('gpt2') "
                         "only; transformers' GGUF support (AutoTokenizer.from_pretrained(folder, gguf_file=...)) "
                         "reads more kinds")
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre={pre!r}: the course knows the splits {sorted(PRE_TOKENIZERS)}")
    tokens = _need(md, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _need(md, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's split, then bytes -> letters
    if PRE_TOKENIZERS[pre]:
        split = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), split])
    tok.pre_tokenizer = split
    tok.decoder = decoders.ByteLevel()
    types = md.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens: the file "
                         "is damaged")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])

    def token(key):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[int(i)]

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=token("bos"), eos_token=token("eos"), unk_token=token("unknown"),
        pad_token=token("padding"), chat_template=md.get("tokenizer.chat_template"))
