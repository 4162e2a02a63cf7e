"""``python -m modern_block COMMAND ...``: the course's command lines, one word each.

    python -m modern_block train --arch llama --quick --out runs/llama     # one model (training.cli)
    python -m modern_block compare --quick --out runs/compare              # a study (training.study)
    python -m modern_block grade submissions/ --reference exercises/       # a class (classroom.grading.grade)
    python -m modern_block exercises build                                 # exercises/ from solutions/

Under torchrun the same words work: ``torchrun --nproc_per_node 2 -m modern_block train ...``.
"""

import importlib
import sys

COMMANDS = {  # the command -> (module, its function(argv) that runs it, what it does)
    "train": ("modern_block.training.cli", "train_main", "train one model on characters; --resume continues a run"),
    "compare": ("modern_block.training.cli", "compare_main", "models at their own rates, paired 95% intervals "
                "(--study quick, laptop, gpu, ladder, ablations, attention)"),
    "grade": ("modern_block.classroom.grading.grade", "main", "grade exercise notebooks, a whole class at once"),
    "exercises": ("modern_block.classroom.exercises", "main", "exercises/ from solutions/ (build, build --check)"),
}


def usage() -> str:
    lines = ["usage: python -m modern_block COMMAND [options]   (COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<10} {what}" for name, (_, _, what) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"{usage()}\n\nerror: unknown command {command!r}: choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module, function, _ = COMMANDS[command]
    return getattr(importlib.import_module(module), function)(rest)


if __name__ == "__main__":
    sys.exit(main())
