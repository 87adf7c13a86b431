"""Write the full model of a sharded checkpoint (train.strategy=fsdp) to one file.

python scripts/consolidate.py --checkpoint checkpoints/default/best.pt
python scripts/evaluate.py --checkpoint checkpoints/default/best.full.pt
"""

from {{ cookiecutter.package_name }}.tools.evaluate import consolidate_main

if __name__ == "__main__":
    raise SystemExit(consolidate_main())
