"""Training the course's models on characters, and comparing them fairly. What the lessons use:

    load_text()                        the corpus, its tokenizer and the train/val split, in one call
    train(cfg, out_dir)                one run (resumable)
    STUDIES, run_study(study)          a study: rates chosen on some seeds, losses reported on others; its
                                       ``Results`` give the paired intervals, the report, the table and the figures
    paired_difference, holm_verdicts   the paired t interval and its verdict, and Holm's adjustment of several
    build_model, BatchSampler, lr_at, make_optimizer   the pieces lesson 08 writes out by hand
"""

from ..statistics import holm_verdicts, paired_difference
from .config import TrainConfig, lr_at, make_optimizer, quick_config
from .data import BatchSampler, load_text
from .ladder import build_model, size_table
from .report import plot_differences
from .study import STUDIES, Results, Study, run_study
from .trainer import train

__all__ = ["STUDIES", "BatchSampler", "Results", "Study", "TrainConfig", "build_model", "holm_verdicts", "load_text",
           "lr_at", "make_optimizer", "paired_difference", "plot_differences", "quick_config", "run_study",
           "size_table", "train"]
