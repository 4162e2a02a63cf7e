"""What one process of a run trains with (device, batches, model, optimizer), built in a fixed seeded order so
the same settings give the same numbers; sizes that cannot fit the device are refused before any allocation."""

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from .checkpoint import CheckpointError
from .config import EVAL_SEED, ConfigError, TrainConfig, make_optimizer
from .data import BatchSampler, CharTokenizer, Corpus, fixed_batches, load_text
from .device import DeviceSetup, choose_device, flops_per_token, matmul_parameters, memory_bytes
from .distributed import Ranks
from .ladder import build_model
from .step import Forward


@dataclass
class RunParts:
    """One process's share of a run. ``micro``: sequences per forward/backward pass; ``eval_sets``: split ->
    (number of evaluation batches in all, [(index, x, y)] of this process)."""

    cfg: TrainConfig
    setup: DeviceSetup
    micro: int
    corpus_name: str
    tokenizer: CharTokenizer
    sampler: BatchSampler
    eval_sets: dict
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    forward: Forward

    @property
    def flops_per_token(self) -> int:
        c = self.cfg
        return flops_per_token(matmul_parameters(self.model), c.n_layers, c.n_heads, c.d // c.n_heads, c.block_size)

    def state(self) -> dict:
        return {"config": asdict(self.cfg), "chars": self.tokenizer.chars, "corpus": self.corpus_name,
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "sampler": self.sampler.state()}

    def restore(self, ckpt: dict, path) -> None:
        """Load the checkpoint's states; a ``CheckpointError`` naming ``path`` when they do not fit."""
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            if self.scaler is not None and ckpt["scaler"] is not None:
                self.scaler.load_state_dict(ckpt["scaler"])
            self.sampler.set_state(ckpt["sampler"])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"the checkpoint {path} does not fit this model ({str(err).splitlines()[0][:200]})"
                                  "; restore a good copy, or start the run again with --overwrite") from None


def build_parts(cfg: TrainConfig, ranks: Ranks, corpus: Corpus | None = None, verbose: bool = True,
                resumed: dict | None = None) -> RunParts:
    """The parts of ``cfg``'s run in this process; ``resumed``: the checkpoint whose characters the text must have."""
    world, rank = ranks.world_size, ranks.rank
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size ({cfg.batch_size}) is the global batch and must be divisible by the "
                          f"number of processes ({world})")
    per_rank = cfg.batch_size // world
    micro = cfg.micro_batch_size or per_rank
    if per_rank % micro:
        raise ConfigError(f"each of the {world} process(es) takes {per_rank} sequences per step, which "
                          f"micro_batch_size ({micro}) must divide")
    setup = choose_device(ranks.device(cfg.device))
    dev = setup.device

    corpus, tokenizer, train_ids, val_ids = load_text(corpus, verbose)
    if resumed is not None and resumed["chars"] != tokenizer.chars:
        raise ConfigError(f"the checkpoint was trained on a different text (corpus {resumed['corpus']!r}, vocabulary "
                          f"of {len(resumed['chars'])}); cannot resume on {corpus.name!r}")
    check_memory(cfg, setup, world, micro, tokenizer.vocab_size)
    if len(val_ids) <= cfg.block_size:
        raise ConfigError(f"block_size ({cfg.block_size}) must be shorter than the validation text "
                          f"({len(val_ids):,} characters of {corpus.name!r}, the last 10%)")
    sampler = BatchSampler(train_ids, cfg.block_size, cfg.batch_size, cfg.seed, dev, rank, world)
    eval_sets = {}
    for i, (split, ids) in enumerate((("train", train_ids), ("val", val_ids))):
        batches = fixed_batches(ids, cfg.block_size, cfg.batch_size, cfg.eval_batches, EVAL_SEED + i)
        eval_sets[split] = (len(batches), [(j, x.to(dev), y.to(dev)) for j, (x, y) in enumerate(batches)
                                           if j % world == rank])

    torch.manual_seed(cfg.seed)  # model initialisation and dropout
    model = build_model(cfg.arch, cfg.shape, tokenizer.vocab_size).to(dev)
    if rank > 0:
        torch.manual_seed(cfg.seed + rank)  # the same initial model everywhere, a dropout stream per process
    optimizer = make_optimizer(model, cfg, fused=dev.type == "cuda")
    scaler = torch.amp.GradScaler("cuda") if setup.needs_scaler else None
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast
        torch.backends.cudnn.allow_tf32 = True
    forward = Forward(model, cfg.compile if cfg.compile is not None else dev.type == "cuda")
    return RunParts(cfg, setup, micro, corpus.name, tokenizer, sampler, eval_sets, model, optimizer, scaler, forward)


def check_memory(cfg: TrainConfig, setup: DeviceSetup, world: int, micro: int, vocab_size: int) -> None:
    """Refuse sizes whose evaluation batches and one micro-batch's fp32 logits, softmax and gradient (a lower
    bound on a step) cannot fit."""
    total = memory_bytes(setup)
    if total is None:
        return
    own_eval = -(-cfg.eval_batches // world)  # batches of one process, per split
    eval_bytes = 2 * own_eval * 2 * cfg.batch_size * (cfg.block_size + 1) * 8  # 2 splits, x and y, int64
    step_bytes = 3 * micro * cfg.block_size * vocab_size * 4
    if eval_bytes + step_bytes > total:
        raise ConfigError(
            f"these sizes need at least {(eval_bytes + step_bytes) / 2**30:,.1f} GiB on {setup.name} "
            f"({eval_bytes / 2**30:,.1f} GiB for {cfg.eval_batches:,} evaluation batches per split, "
            f"{step_bytes / 2**30:,.1f} GiB for the logits of {micro:,} sequences at once), which has "
            f"{total / 2**30:,.1f} GiB: lower --eval-batches, --batch-size or --micro-batch-size")
