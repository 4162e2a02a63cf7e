"""Training: the course's models trained on characters, and lesson 08's experiments.

* ``data``: tinyshakespeare (cached, checksummed, an offline fallback), a character tokenizer, seeded batches;
* ``config``: a run's settings (``TrainConfig``), the quick and GPU scales, the schedule, the optimizer groups;
* ``options``: the command-line options ``train`` and ``compare`` share;
* ``trainer``: the training loop and ``python -m modern_block train``;
* ``run_folder``: a run's files kept safe (lock, atomic writes, checksummed checkpoints);
* ``distributed``: data parallelism under torchrun;
* ``device``: devices, precision, FLOPs per token and MFU;
* ``ladder``: the models between GPT-2 and Llama, each sized to GPT-2's parameters;
* ``experiments`` and ``compare_cli``: the learning-rate sweep, the comparison, the ladder, the ablations and
  ``python -m modern_block compare``.
"""
