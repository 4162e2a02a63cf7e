"""What every loader checks before it hands back a model: the file's tensors against what its config describes.

A checkpoint is a config plus named tensors, and the two can disagree: a config with one layer more than the
weights, a head count that splits the rows differently, a tensor left out or one too many. Loaded without
checking, such a model runs and writes fluent nonsense (a missing layer is filled with random numbers). So each
loader lists the tensors the config implies, with their shapes, and compares them with the tensors the file
holds; any difference is a ``CheckpointError`` that names the config field and both values.

What no comparison can see: a changed number inside the weights. Safetensors and GGUF carry no checksum, so a
flipped bit that leaves a finite number loads; only NaN and infinity are caught. The installed SmolLM2 file is
checked against the hash its package recorded (``modern_block.interop.gguf.smollm2_path``).
"""

import hashlib
import re
from collections.abc import Sequence

import torch


class CheckpointError(ValueError):
    """A checkpoint (a pretrained model's, or a training run's) that cannot be read or written as it is:
    damaged, incomplete, at odds with its config, or refused by a full disk."""


def sha256_of(path) -> str:
    """The hex sha256 of a file, read 1 MiB at a time (the one file-hashing loop of the package)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def layer_indices(names, pattern: str) -> set[int]:
    """The layer numbers that occur in tensor names, e.g. pattern r"^blk\\.(\\d+)\\." or r"\\.layers\\.(\\d+)\\."."""
    found = set()
    for name in names:
        m = re.search(pattern, name)
        if m:
            found.add(int(m.group(1)))
    return found


def _span(indices: set[int]) -> str:
    if not indices:
        return "none"
    lo, hi = min(indices), max(indices)
    return f"{lo}..{hi}" if indices == set(range(lo, hi + 1)) else ", ".join(map(str, sorted(indices)))


def compare_tensors(found: dict[str, tuple], expected: dict[str, tuple], *, source: str, layer_pattern: str,
                    layers_field: str, n_layers: int, shape_rules: Sequence[tuple[str, str]] = (),
                    optional: tuple[str, ...] = ()) -> None:
    """Raise ``CheckpointError`` unless ``found`` (name -> shape, from the file) holds exactly the tensors of
    ``expected`` (name -> shape, from the config); names in ``optional`` may be absent.

    The message names the config field: ``layers_field`` when the file's layer numbers differ from
    ``n_layers``; for a shape, the rule in ``shape_rules`` ((name regex, "which config fields set this
    shape")) that matches the tensor.
    """
    problems = []
    have = layer_indices(found, layer_pattern)
    want = set(range(n_layers))
    if have != want:
        problems.append(f"{layers_field}={n_layers} but the file holds tensors for {len(have)} layers "
                        f"(layer numbers {_span(have)})")
    mismatched: dict[str, list[str]] = {}  # the same tensor in every layer is one problem: kind -> [names]
    for name, shape in expected.items():
        if name in found and tuple(found[name]) != tuple(shape):
            mismatched.setdefault(re.sub(r"\d+", "#", name), []).append(name)
    for names in mismatched.values():
        name = names[0]
        why = next((rule for pattern, rule in shape_rules if re.search(pattern, name)), "the config's sizes")
        more = f", and {len(names) - 1} more like it" if len(names) > 1 else ""
        problems.append(f"{name} has shape {list(found[name])} in the file, but the config gives "
                        f"{list(expected[name])} ({why}{more})")
    odd_layers = have ^ want  # layers already reported: their tensors are not listed again

    def in_odd_layer(name):
        m = re.search(layer_pattern, name)
        return m is not None and int(m.group(1)) in odd_layers

    missing = [n for n in expected if n not in found and n not in optional and not in_odd_layer(n)]
    extra = [n for n in found if n not in expected and not in_odd_layer(n)]
    if missing:
        problems.append(f"{len(missing)} tensor(s) the config needs are missing: {', '.join(missing[:4])}"
                        f"{' ...' if len(missing) > 4 else ''}")
    if extra:
        problems.append(f"{len(extra)} tensor(s) have no place in the model the config describes: "
                        f"{', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}")
    if problems:
        raise CheckpointError(f"{source}: the weights do not match the config: " + "; ".join(problems))


def check_finite(state: dict[str, torch.Tensor], source: str) -> None:
    """Refuse NaN and infinity in the weights: the one kind of damage a file without a checksum still shows."""
    for name, tensor in state.items():
        # NaN and infinity survive a sum, so a finite sum clears the tensor at a fraction of an element-wise test
        if tensor.is_floating_point() and not torch.isfinite(tensor.sum()) and not torch.isfinite(tensor).all():
            raise CheckpointError(f"{source}: {name} holds NaN or infinite values: the file is damaged "
                                  "(this format has no checksum, so damage that leaves finite numbers cannot be "
                                  "detected)")
