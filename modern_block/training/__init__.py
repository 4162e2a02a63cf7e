"""Training the course's models on characters, and comparing them fairly. What the lessons use:

    load_text()                        the corpus, its tokenizer and the train/val split, in one call
    train(cfg, out_dir)                one run (resumable; ``TrainConfig``, ``quick_config`` ...)
    STUDIES, run_study(study)          a study: rates chosen on some seeds, losses reported on others
    paired_difference, mean_interval   the paired t interval and its verdict; holm_verdicts for a table of them
    report_text, plot_*                a study's report and figures
    lr_at, make_optimizer, BatchSampler, build_model   the pieces lesson 08 writes out by hand
"""

from .config import TrainConfig, gpu_config, laptop_config, lr_at, make_optimizer, quick_config
from .data import BatchSampler, load_text
from .ladder import build_model
from .report import plot_curve_bands, plot_differences, plot_sweep, report_text
from .statistics import format_seeds, holm_verdicts, mean_interval, paired_difference
from .study import STUDIES, Results, Study, run_study
from .trainer import train

__all__ = ["STUDIES", "Results", "Study", "TrainConfig", "gpu_config", "laptop_config", "load_text", "mean_interval",
           "paired_difference", "quick_config", "run_study", "train",
           "BatchSampler", "build_model", "format_seeds", "holm_verdicts", "lr_at", "make_optimizer",
           "plot_curve_bands", "plot_differences", "plot_sweep", "report_text"]
