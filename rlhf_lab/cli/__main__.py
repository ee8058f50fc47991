"""`python -m rlhf_lab.cli ...`: the `rlhf-lab` command line."""

from rlhf_lab.cli import main

main()
