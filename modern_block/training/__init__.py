"""Training: the course's models trained on characters, and lesson 08's experiments.

* ``data``: tinyshakespeare (cached, checksummed, an offline fallback), a character tokenizer, seeded batches;
* ``rungs``: the models a comparison trains, as data (the shape, the rungs between GPT-2 and Llama);
* ``config``: a run's settings (``TrainConfig``), the quick and GPU scales, the schedule, the optimizer groups;
* ``options``: the command-line options ``train`` and ``compare`` share;
* ``step``: one training step and one evaluation, as functions;
* ``parts``: what one process of a run trains with (device, batches, model, optimizer);
* ``trainer``: the training loop; ``train_cli``: ``python -m modern_block train``;
* ``run_folder``, ``checkpoint``, ``files``: a run's files kept safe (lock, checksummed checkpoints, atomic writes);
* ``signals``: Ctrl-C and SIGTERM; ``distributed``: data parallelism under torchrun;
* ``device``: devices and precision; ``flops``: FLOPs per token and MFU;
* ``ladder``: the models between GPT-2 and Llama, each sized to GPT-2's parameters;
* ``workers``: many trainings, here or in worker processes; ``experiments``: the learning-rate sweep, the
  comparison, the ladder and the ablations; ``report``: their report and figures; ``compare_cli``:
  ``python -m modern_block compare``.
"""
