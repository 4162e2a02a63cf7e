"""Where lesson 11's configs come from (modern_block/interop/config_source.py): the presets and the outside
configs by name, a dict, a config.json or .gguf path, a file's bytes; a multimodal config's language model; and
a clear error for anything else."""

import json

import pytest

from modern_block.interop.config_source import CONFIG_PRESETS, CONFIGS, PUBLISHED, language_model, load_config


@pytest.mark.parametrize("name", list(CONFIG_PRESETS) + list(PUBLISHED))
def test_every_named_config_is_a_published_file_kept_in_the_package(name):
    file, repository = (CONFIG_PRESETS | PUBLISHED)[name]
    cfg = load_config(name)
    assert cfg == json.loads((CONFIGS / file).read_text()) and "/" in repository
    assert isinstance(cfg["model_type"], str) and cfg["num_hidden_layers"] >= 1


def test_a_dict_a_path_and_bytes_give_the_same_config(tmp_path):
    cfg = load_config("Qwen2.5-7B")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert load_config(dict(cfg)) == load_config(path) == load_config(str(path)) == load_config(path.read_bytes())
    assert load_config(cfg) is not cfg  # a copy: the card never changes the caller's dict


def test_bad_sources_name_the_rule(tmp_path):
    (tmp_path / "notes.json").write_text("hidden_size: 4096\n")
    with pytest.raises(ValueError, match="is not JSON"):
        load_config(tmp_path / "notes.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(TypeError, match="holds a JSON list"):
        load_config(tmp_path / "list.json")
    with pytest.raises(ValueError, match="is not JSON"):
        load_config(b"\xff\xfe not utf-8")
    with pytest.raises(ValueError, match="GGUF bytes: give the .gguf file's path"):
        load_config(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ValueError, match="preset .* or an existing file"):
        load_config("Llama 9 1T")
    with pytest.raises(TypeError, match="source must be"):
        load_config(42)


def test_a_multimodal_config_gives_its_text_config():
    text = load_config("Gemma 3 27B")
    wrapped = {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 1152}}
    assert language_model(wrapped) == (text, True)
    assert language_model(text) == (text, False)
