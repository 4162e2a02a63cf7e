"""Where a config comes from: a preset name (published configs kept in ``configs/``), a dict, a ``config.json`` or
``.gguf`` path, or a file's bytes; and, inside a multimodal config, the language model's own config."""

import json
from pathlib import Path

from .gguf import gguf_hf_config

CONFIGS = Path(__file__).parent / "configs"
CONFIG_PRESETS = {  # name -> (file in configs/, the repository that publishes the config)
    "Llama 3.1 8B": ("llama-3.1-8b.json", "meta-llama/Llama-3.1-8B"),
    "Llama 3.1 70B": ("llama-3.1-70b.json", "meta-llama/Llama-3.1-70B"),
    "Qwen3-0.6B": ("qwen3-0.6b.json", "Qwen/Qwen3-0.6B"),
    "Qwen3-235B-A22B": ("qwen3-235b-a22b.json", "Qwen/Qwen3-235B-A22B"),
    "Mistral 7B v0.3": ("mistral-7b-v0.3.json", "mistralai/Mistral-7B-v0.3"),
    "Gemma 3 27B": ("gemma-3-27b.json", "google/gemma-3-27b-it (its text_config, defaults written out)"),
    "gpt-oss-120b": ("gpt-oss-120b.json", "openai/gpt-oss-120b"),
    "DeepSeek-V3": ("deepseek-v3.json", "deepseek-ai/DeepSeek-V3"),
    "Kimi K2": ("kimi-k2.json", "moonshotai/Kimi-K2-Instruct"),
    "SmolLM2-135M-Instruct": ("smollm2-135m-instruct.json", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
PUBLISHED = {  # name -> (file in configs/, the repository whose config.json it copies): lesson 11's outside configs
    "Qwen2.5-7B": ("qwen2.5-7b.json", "Qwen/Qwen2.5-7B"),
    "Mistral Small 3": ("mistral-small-24b-base-2501.json", "mistralai/Mistral-Small-24B-Base-2501"),
    "OLMo 2 7B": ("olmo-2-1124-7b.json", "allenai/OLMo-2-1124-7B"),
    "Mixtral 8x7B": ("mixtral-8x7b-v0.1.json", "mistralai/Mixtral-8x7B-v0.1"),
    "Llama 4 Scout (text)": ("llama-4-scout-17b-16e-text.json", "meta-llama/Llama-4-Scout-17B-16E (its text_config)"),
    "Gemma 2 9B": ("gemma-2-9b.json", "google/gemma-2-9b"),
    "Phi-4-mini": ("phi-4-mini-instruct.json", "microsoft/Phi-4-mini-instruct"),
    "gpt-oss-20b": ("gpt-oss-20b.json", "openai/gpt-oss-20b"),
    "Mamba 130M": ("mamba-130m-hf.json", "state-spaces/mamba-130m-hf"),  # not a transformer block: refused
}


def load_config(source) -> dict:
    """The config of a preset (or published) name, a dict, a ``config.json`` or ``.gguf`` path, or a file's bytes."""
    if isinstance(source, dict):
        return dict(source)
    if isinstance(source, str) and source in CONFIG_PRESETS:
        source = CONFIGS / CONFIG_PRESETS[source][0]
    elif isinstance(source, str) and source in PUBLISHED:
        source = CONFIGS / PUBLISHED[source][0]
    if isinstance(source, (bytes, bytearray)):
        data, where = bytes(source), "the input"
    elif isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(f"source must be a preset ({', '.join(CONFIG_PRESETS)}) or an existing file, "
                             f"got {str(source)!r}")
        if path.read_bytes()[:4] == b"GGUF":
            return gguf_hf_config(path)
        data, where = path.read_bytes(), str(path)
    else:
        raise TypeError(f"source must be a preset name, a dict, a path or bytes, got {type(source).__name__}")
    if data[:4] == b"GGUF":
        raise ValueError("GGUF bytes: give the .gguf file's path (its tensors are read from disk)")
    try:
        cfg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not JSON ({err}); a config.json holds one JSON object") from None
    if not isinstance(cfg, dict):
        raise TypeError(f"{where} holds a JSON {type(cfg).__name__}; a config.json holds one JSON object")
    return cfg


def language_model(cfg: dict) -> tuple[dict, bool]:
    """(the language model's config, whether it came from a multimodal config's ``text_config``)."""
    text = cfg.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in cfg:
        return text, True
    return cfg, False
