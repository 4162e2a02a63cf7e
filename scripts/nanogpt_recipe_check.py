"""An independent check of the laptop scale's GPT-2 arm: nanoGPT's CPU recipe trained by a separate, minimal loop.

    python scripts/nanogpt_recipe_check.py [--steps 2000] [--seed 0] [--course]

The GPT-2 arm of ``compare --laptop`` lands above nanoGPT's published 1.88. This script rebuilds that run
without the course's trainer: its own data sampling (random offsets from the global generator, as nanoGPT draws
them), its own schedule, AdamW groups, clipping and evaluation on 20 random batches; with ``--course`` the model is
the course's ``GPT2LM(bias=False)`` (tied), else a small GPT written here from the recipe's facts (bias-free
LayerNorm, exact GELU, tied head, weights N(0, 0.02), the residual projections N(0, 0.02/sqrt(2L))). Each
evaluation prints train and val loss, so the curves can be set against the course trainer's
(results/laptop/results.json) and against published runs of the recipe.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modern_block.training.data import CharTokenizer, load_corpus, train_val_split  # noqa: E402

D, LAYERS, HEADS, BLOCK, BATCH = 128, 4, 4, 64, 12
LR, MIN_LR, WARMUP, DECAY, BETAS, CLIP = 1e-3, 1e-4, 100, 0.1, (0.9, 0.99), 1.0


class Norm(nn.Module):
    """LayerNorm with a scale and no shift."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, None, 1e-5)


class Layer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = Norm(d), Norm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):  # x: [B, T, d]
        B, T, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)  # [B, T, d] each
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))  # [B, h, T, dh]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + self.out(a)
        return x + self.down(F.gelu(self.up(self.n2(x))))


class SmallGPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, D), nn.Embedding(BLOCK, D)
        self.layers = nn.ModuleList(Layer(D, HEADS) for _ in range(LAYERS))
        self.norm = Norm(D)
        self.head = nn.Linear(D, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith(("out.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):  # idx: [B, T]
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))  # [B, T, d]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))  # [B, T, V]


def lr_at(step, steps):
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    progress = (step - WARMUP) / (steps - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * progress)) * (LR - MIN_LR)


def batch(data):
    starts = torch.randint(len(data) - BLOCK, (BATCH,))
    windows = data[starts[:, None] + torch.arange(BLOCK + 1)]  # [B, T+1]
    return windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def estimate(model, data, batches=20):
    model.eval()
    losses = []
    for _ in range(batches):
        x, y = batch(data)
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--course", action="store_true", help="train the course's GPT2LM(bias=False) instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    text = load_corpus(verbose=False).text
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(tok.encode(text))
    if args.course:
        from modern_block import GPT2LM

        model = GPT2LM(tok.vocab_size, d=D, n_layers=LAYERS, n_heads=HEADS, max_len=BLOCK, bias=False)
    else:
        model = SmallGPT(tok.vocab_size)
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": DECAY},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=LR, betas=BETAS)
    print(f"{'course GPT2LM' if args.course else 'SmallGPT'}: {sum(p.numel() for p in params):,} parameters")
    t0 = time.process_time()
    for step in range(args.steps + 1):
        if step % 250 == 0:
            print(f"step {step}: train {estimate(model, train_ids):.4f} val {estimate(model, val_ids):.4f} "
                  f"({time.process_time() - t0:.0f} CPU-s)", flush=True)
        if step == args.steps:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps)
        x, y = batch(train_ids)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()


if __name__ == "__main__":
    main()
