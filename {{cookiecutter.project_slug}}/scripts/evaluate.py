"""Evaluate a checkpoint on the validation split and print its metrics.

python scripts/evaluate.py --checkpoint checkpoints/default/best.pt
python scripts/evaluate.py --checkpoint checkpoints/default/best.pt run.device=cpu
"""

from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main

if __name__ == "__main__":
    raise SystemExit(evaluate_main())
