"""``load_pretrained``: a checkpoint (a local folder, a Hub name, or a .gguf file) -> the course model, checked.

Before anything is loaded: is it a folder holding ``config.json`` and weights, and are the weight files whole
(each safetensors header parses, its tensors lie inside the file and fill it)? Then transformers loads it, and its
loading report must be empty: a tensor missing, one too many or of another shape than the config implies is a
``CheckpointError`` naming the tensor, both shapes and the config fields that set them, never a model with a
randomly initialised layer. ``from_hf`` converts it; NaN or infinite weights are refused.

What cannot be checked: safetensors carries no checksum, so a flipped bit that leaves a finite number loads
as it is; and a config that splits the same rows into other heads (18 heads of 32 instead of 9 of 64, with no
``head_dim`` in the config) gives the same shapes, so only a ``head_dim`` written in the config is checked.
"""

import re
from pathlib import Path

import torch

from .gguf import load_gguf
from .hf_config import transformers_module
from .verify import CheckpointError, check_finite

HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer*",
             "special_tokens_map.json", "vocab.json", "merges.txt", "*.tiktoken"]
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "owner/name" or "name"
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
HF_SHAPE_RULES = [  # which config fields set each shape (for the error message)
    (r"q_proj\.", "rows = num_attention_heads x head_dim, columns = hidden_size"),
    (r"[kv]_proj\.", "rows = num_key_value_heads x head_dim, columns = hidden_size"),
    (r"o_proj\.", "rows = hidden_size, columns = num_attention_heads x head_dim"),
    (r"(gate|up|down)_proj\.", "intermediate_size and hidden_size"),
    (r"embed_tokens|lm_head|wte", "vocab_size x hidden_size"),
    (r"c_attn|c_fc|c_proj", "n_embd, n_head and n_inner"),
    (r"norm|ln_", "hidden_size (or head_dim for QK-norm)"),
]


# ---------------------------------------------------------------------------------------------
# Where the checkpoint is
# ---------------------------------------------------------------------------------------------
def resolve_checkpoint(name_or_path) -> Path:
    """A local folder as it is; a Hub name downloaded (once) into the Hugging Face cache. Errors say which."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; give the folder that holds config.json and the weights "
                              "(or a .gguf file)")
    looks_like_path = text.startswith(("/", ".", "~")) or "\\" in text or text.count("/") > 1
    if looks_like_path or not HUB_NAME.match(text):
        raise FileNotFoundError(f"no such folder: {path} (nor is {text!r} a Hub model name such as "
                                "'HuggingFaceTB/SmolLM2-135M')")
    return _download(text)


def _download(name: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:  # the Hugging Face cache first: no network needed for a model downloaded before
        folder = Path(snapshot_download(name, allow_patterns=HUB_FILES, local_files_only=True))
        if (folder / "config.json").exists():
            return folder
    except Exception:  # noqa: BLE001 - not cached (yet): ask the Hub
        pass
    try:
        folder = Path(snapshot_download(name, allow_patterns=HUB_FILES))
        if not any(folder.glob("*.safetensors")):  # an older repository: PyTorch's pickled weights
            folder = Path(snapshot_download(name, allow_patterns=HUB_FILES + ["pytorch_model*.bin*"]))
        return folder
    except GatedRepoError:
        raise CheckpointError(f"{name} is gated on the Hugging Face Hub: accept its license on the model's page, "
                              "then log in (`hf auth login`, or set HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"{name!r} is neither a local folder nor a model on the Hugging Face Hub") from None
    except Exception as err:  # noqa: BLE001 - no network, a proxy, a full disk ...
        raise ConnectionError(f"{name!r} is not a local folder, and the Hugging Face Hub could not provide it "
                              f"({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}). "
                              "Offline, modern_block.interop.load_gguf() loads the SmolLM2 checkpoint installed "
                              "from the package registry") from None


# ---------------------------------------------------------------------------------------------
# What the folder holds
# ---------------------------------------------------------------------------------------------
def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header, read by the safetensors library, which checks that
    the file is whole: a header that parses, every tensor's byte range matching its dtype and shape, the ranges
    tiling the data exactly. Its refusals become a ``CheckpointError`` that says what is wrong with the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as err:
        said = str(err).removeprefix("Error while deserializing header: ")
    if "header too" in said:  # the first 8 bytes give no header length that fits the file
        raise CheckpointError(f"{path} is not a safetensors file (or is truncated): {said}")
    if "not fully covered" in said:
        raise CheckpointError(f"{path} is truncated, or longer than its header describes ({said})")
    if "invalid shape, data type, or offset" in said:
        raise CheckpointError(f"{path}: a tensor does not fit its bytes ({said}): the header is damaged")
    raise CheckpointError(f"{path}: the safetensors header is damaged ({said[:200]})")


def checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every weight file in a checkpoint folder."""
    files = sorted(folder.glob("*.safetensors"))
    shapes = {}
    if files:
        for file in files:
            shapes.update(safetensors_shapes(file))
        return shapes
    pickled = sorted(folder.glob("pytorch_model*.bin"))
    if not pickled:
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = f"; it holds {ggufs[0]}: load that file's path instead" if ggufs else ""
        raise CheckpointError(f"{folder} holds no weights (model.safetensors or pytorch_model.bin){hint}")
    for file in pickled:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:  # noqa: BLE001 - whatever torch says about a damaged pickle
            raise CheckpointError(f"{file} cannot be read ({type(err).__name__}): the file is damaged") from None
        shapes.update({k: tuple(v.shape) for k, v in state.items()})
    return shapes


def check_folder(folder: Path):
    """The folder's transformers config, after checking that its weight files are whole (``CheckpointError``)."""
    tf = transformers_module()
    if not (folder / "config.json").is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = f"; it holds {ggufs[0]}: load that file's path instead" if ggufs else ""
        raise CheckpointError(f"{folder} is not a checkpoint: it has no config.json{hint}")
    try:
        config = tf.AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError, OSError) as err:
        raise CheckpointError(f"{folder}/config.json cannot be read as a model config ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from None
    checkpoint_shapes(folder)  # whole, readable files (transformers' loading report checks names and shapes)
    return config


def loading_problems(report: dict) -> str:
    """transformers' loading report in words: each mismatched tensor with the config fields that set its shape."""
    out = [f"{name} is {list(got)} in the file, {list(want)} by the config ({rule})"
           for name, got, want in report.get("mismatched_keys", [])
           for rule in [next((r for p, r in HF_SHAPE_RULES if re.search(p, name)), "the config's sizes")]]
    out += [f"{kind.split('_')[0]} tensors {sorted(report[kind])[:4]}" for kind in ("missing_keys", "unexpected_keys")
            if report.get(kind)]
    return "; ".join(out + [str(e) for e in report.get("error_msgs", [])[:2]])


def check_tokenizer_files(folder: Path) -> None:
    if not any(all((folder / f).is_file() for f in group) for group in TOKENIZER_FILES) and \
            not any(folder.glob("*.tiktoken")):
        raise FileNotFoundError(f"{folder} holds no tokenizer files (tokenizer.json, tokenizer.model, or vocab.json "
                                "with merges.txt): load it with tokenizer=False, or copy the tokenizer files from "
                                "the model's repository into the folder")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
def load_pretrained(name_or_path, *, dtype: torch.dtype = torch.float32, device=None, tokenizer: bool = False,
                    **from_pretrained_kwargs):
    """Load a checkpoint of a supported family as the course model (eval mode), checked first.

    ``name_or_path``: a local folder (``config.json`` + safetensors, as ``save_pretrained`` writes it), a
    Hub name (downloaded once into the Hugging Face cache; needs internet), or a ``.gguf`` file (then
    ``load_gguf``). Extra keywords go to ``AutoModelForCausalLM.from_pretrained``. With ``tokenizer=True``
    returns ``(model, tokenizer)``. For example, with internet::

        from modern_block import generate
        from modern_block.interop import load_pretrained
        model, tok = load_pretrained("Qwen/Qwen3-0.6B", tokenizer=True)   # or "HuggingFaceTB/SmolLM2-135M"
        idx = tok("The modern transformer block", return_tensors="pt").input_ids
        print(tok.decode(generate(model, idx, max_new_tokens=20)[0]))

    Llama 3.1/3.2 checkpoints (rope_type "llama3") carry their RoPE scaling into the course model.
    Nothing here changes transformers' logging: what it reports, you see.
    """
    if str(name_or_path).endswith(".gguf"):
        if from_pretrained_kwargs:
            raise TypeError(f"{sorted(from_pretrained_kwargs)} apply to Hugging Face checkpoints, not to a GGUF file")
        return load_gguf(name_or_path, tokenizer=tokenizer, dtype=dtype, device=device)
    from .hf import from_hf

    tf = transformers_module()
    folder = resolve_checkpoint(name_or_path)
    config = check_folder(folder)
    if tokenizer:
        check_tokenizer_files(folder)
    hf_model, report = tf.AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=dtype,
                                                               output_loading_info=True, ignore_mismatched_sizes=True,
                                                               **from_pretrained_kwargs)
    problems = loading_problems(report)
    if problems:
        raise CheckpointError(f"{folder} does not match its config.json: {problems}")
    check_finite(hf_model.state_dict(), str(folder))  # named as in the file
    model = from_hf(hf_model)
    del hf_model
    if device is not None:
        model.to(device)
    if tokenizer:
        return model, tf.AutoTokenizer.from_pretrained(folder)
    return model
