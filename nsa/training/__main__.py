"""`python -m nsa.training`: the trainer's command line (nsa.training.cli)."""

from nsa.training.cli import console_main

console_main()
