"""`python -m nsa.training`: the trainer's command line (nsa.training.cli).

Before the trainer's imports (torch takes seconds): the parent-death signal under torchrun and the
NSA_FAULT=wait@imports testing aid (nsa.training.safety.early_start).
"""

from nsa.training.safety import early_start

early_start()

from nsa.training.cli import console_main  # noqa: E402 - after early_start, on purpose

console_main()
