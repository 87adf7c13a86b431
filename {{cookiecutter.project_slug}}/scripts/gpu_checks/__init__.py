"""The checks of scripts/gpu_check.py, in parts a reader can take one at a time.

common.py    what every check uses: the machine, a check's processes, its figures and targets
paths.py     one-process paths through the project's own scripts (train, evaluate, predict...)
ranks.py     several ranks: torchrun, DDP, SyncBatchNorm, fsdp (two ranks share one GPU)  # feature: fsdp
ranks.py     several ranks: torchrun, DDP, SyncBatchNorm (two ranks share one GPU)  # feature: !fsdp
numerics.py  loss traces (CPU against CUDA, bf16 and fp16 against fp32), TF32, SyncBatchNorm
speed.py     speed against its ceiling: a 100M-parameter language model, the trainer's loop
quick.py     the quick check (--quick): six checks for one short GPU window, first in value
goldens.py   stored loss traces keyed by GPU, torch and CUDA (--export-goldens, --goldens)
registry.py  the checks in the order they run, the quick set, the groups, the CUDA paths
report.py    the report: results, machine and versions, warnings, the JSON file, the tables
             and the block a script greps at the end
"""
