"""The names of the files that training and the tools keep in their folders, in one place:
the code that writes each file and tools/outputs.py (which refuses to write over any of them)
take them from here. Imports no torch: the tools read it at start-up.

A run folder, <run.output_dir>/<run.name>/: the step checkpoints, last.pt and best.pt,
under train.strategy=fsdp a shard folder beside each step file,  # feature: fsdp
config.yaml, run.json (and diff.patch), metrics.csv, curves.png, the trackers' folders and
.lock. Its output folder (<run.output_dir>/) holds runs.csv and its lock, and .hashes.json
(the data digests' cache). A tool that keeps a folder of its own adds its records to the lists
at the end (PROTECTED and the others), so that no other tool writes over them.
"""

from __future__ import annotations

import re

# Step checkpoints as RunFolder.save names them (step_file); the files a tool writes beside
# them (step-N.<what>.pt) are not step checkpoints.
STEP_FILE = re.compile(r"step-\d{8,}\.pt")
SHARD_FOLDER = re.compile(r"step-\d{8,}\.dcp")  # train.strategy=fsdp: a step file's shards  # feature: fsdp
SET_ASIDE = ".bad"  # a checkpoint that failed to load, renamed aside by a resume
LAST, BEST = "last.pt", "best.pt"
RUN_LOCK = ".lock"  # held by the process that trains the run
CONFIG = "config.yaml"
METRICS = "metrics.csv"
CURVES = "curves.png"
RECORD, PATCH = "run.json", "diff.patch"  # what made the run (utils/provenance.py)
HASHES = ".hashes.json"  # the output folder's cache of data digests
TRACKED_STEP = ".tracked_step"  # the last step given to the experiment trackers
TRACKER_FOLDERS = ["tb"]  # TensorBoard's folder, and each tracker's local store:
TRACKER_FOLDERS += ["wandb", "mlruns"]  # feature: trackers
# The output folder's table of runs, and the lock its rewrites take.
RUNS = "runs.csv"
RUNS_LOCK = ".runs.lock"
# A record that failed to read, renamed aside: runs.csv.damaged, then .damaged.2, .3 ...
DAMAGED = re.compile(r".+\.damaged(\.\d+)?")

# What tools/outputs.py protects, by kind. Records no other file is named like: refused
# wherever they are (regular expressions).
PROTECTED = [re.escape(RUN_LOCK), re.escape(RUNS_LOCK), DAMAGED.pattern]
PROTECTED.append(r"events\.out\.tfevents\..*")  # TensorBoard's event files
# Records with common names: refused inside a folder that holds a MARK (or a step file).
RECORDS = [CONFIG, METRICS, RUNS, CURVES, TRACKED_STEP, RECORD, PATCH, HASHES]
# Folders all of whose content is the run's (or its tool's).
OWNED_FOLDERS = list(TRACKER_FOLDERS)
# A folder holding one of these is a run folder (config.yaml, .lock) or an output folder.
MARKS = [CONFIG, RUN_LOCK, RUNS]

# >>> sweeps
# A sweep folder's records.
SWEEP = "sweep.json"
SWEEP_LOCK = ".sweep.lock"  # held for one read-modify-write of sweep.json
SWEEP_RUN_LOCK = ".sweep.run.lock"  # held while a process runs the sweep
STUDY = "study.db"  # --optuna; SQLite keeps -journal, -wal and -shm files beside it
RESULTS = "results.csv"
BEST_CONFIG = "best.yaml"
ARRAY_SCRIPT = "sweep_array.sh"
SWEEP_LOGS = "logs"  # each trial's output (and a SLURM array's)
PROTECTED += [re.escape(SWEEP), rf"{re.escape(STUDY)}(-journal|-wal|-shm)?"]
PROTECTED += [re.escape(SWEEP_LOCK), re.escape(SWEEP_RUN_LOCK)]
RECORDS += [RESULTS, BEST_CONFIG, ARRAY_SCRIPT]
OWNED_FOLDERS.append(SWEEP_LOGS)
MARKS += [SWEEP, SWEEP_LOCK]
# <<< sweeps


def step_file(step: int) -> str:
    """The name of step `step`'s checkpoint (STEP_FILE)."""
    return f"step-{step:08d}.pt"
