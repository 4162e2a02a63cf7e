"""Training the course's models on characters, and comparing them fairly. What the lessons use:

    load_text()                        the corpus, its tokenizer and the train/val split, in one call
    train(cfg, out_dir)                one run (resumable; ``TrainConfig``, ``quick_config`` ...)
    STUDIES, run_study(study)          a study: rates chosen on some seeds, losses reported on others
    paired_difference, mean_interval   the paired t interval and its verdict
"""

from .config import TrainConfig, gpu_config, laptop_config, quick_config
from .data import load_text
from .statistics import mean_interval, paired_difference
from .study import STUDIES, Results, Study, run_study
from .trainer import train

__all__ = ["STUDIES", "Results", "Study", "TrainConfig", "gpu_config", "laptop_config", "load_text", "mean_interval",
           "paired_difference", "quick_config", "run_study", "train"]
