"""The command of the ``best_of_n`` evaluation suite (:mod:`trainers.evaluation.best_of_n_suite`):

    python -m trainers.evaluation.best_of_n --run-dir DIR --set target=POLICY \
        --set best_of_n.orm=ORM_RUN_OR_FOLDER --set best_of_n.prm=PRM_RUN_OR_FOLDER \
        [--set sampling.n=16] [--set prompts.tasks=[chain_sum]] [--set seed=0]

the same job as ``python -m trainers.evaluation.run --config
trainers/evaluation/configs/best_of_n.yaml ...``: this entry point takes that config by default.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainers.evaluation.run import main as run_main

CONFIG = Path(__file__).parent / "configs" / "best_of_n.yaml"


def main(argv: list[str] | None = None) -> int:
    """``trainers.evaluation.run`` with the best_of_n config unless another is given."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--config" not in args and not any(a.startswith("--config=") for a in args):
        args = ["--config", str(CONFIG), *args]
    return run_main(args)


if __name__ == "__main__":
    sys.exit(main())
