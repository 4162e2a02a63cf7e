"""Training the course's models on characters, and comparing them fairly. The lessons use ``load_text`` (text,
tokenizer, split), ``train`` (one resumable run), ``STUDIES`` and ``run_study`` (rates chosen on some seeds, losses
reported on others; ``Results`` give the intervals, report and figures) and the pieces lesson 08 writes by hand."""

from .config import TrainConfig, lr_at, make_optimizer, quick_config
from .data import BatchSampler, load_text
from .ladder import build_model, size_table
from .report import plot_differences
from .statistics import holm_verdicts, paired_difference
from .study import STUDIES, Results, Study, run_study
from .trainer import train

__all__ = ["STUDIES", "BatchSampler", "Results", "Study", "TrainConfig", "build_model", "holm_verdicts", "load_text",
           "lr_at", "make_optimizer", "paired_difference", "plot_differences", "quick_config", "run_study",
           "size_table", "train"]
