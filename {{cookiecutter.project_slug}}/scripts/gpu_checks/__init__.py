"""The checks of scripts/gpu_check.py, in parts a reader can take one at a time.

common.py    what every check uses: the machine, a check's processes, its figures and targets
paths.py     one-process paths through the project's own scripts (train, evaluate, predict...)
ranks.py     several ranks: torchrun, DDP, SyncBatchNorm, fsdp (two ranks share one GPU)  # feature: fsdp
ranks.py     several ranks: torchrun, DDP, SyncBatchNorm (two ranks share one GPU)  # feature: !fsdp
numerics.py  loss traces (CPU against CUDA, bf16 and fp16 against fp32), TF32, SyncBatchNorm
speed.py     speed against its ceiling: a 100M-parameter language model, the trainer's loop
registry.py  the checks in the order they run, and the CUDA paths of the package they cover
report.py    the report: results, machine and versions, warnings, the JSON file and the tables
"""
