"""Distributed training on CPU with gloo, launched the way it runs on GPUs: torchrun on one
machine and as two "nodes" on loopback, equivalence with one process, evaluation over uneven
shards, resume across world sizes, and the SLURM script with srun/scontrol/scancel stubbed.

Each torchrun launch costs a few seconds; the one-process reference run is shared.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY, run_script

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import build_loader
from {{ cookiecutter.package_name }}.data.sampler import ShardedSampler
from {{ cookiecutter.package_name }}.distributed import DistInfo
from {{ cookiecutter.package_name }}.trainer import fit, prepare_process
from {{ cookiecutter.package_name }}.utils.run_files import RUNS_LOCK
from {{ cookiecutter.package_name }}.utils.seed import mix_seed

slow = pytest.mark.slow

# Runs that must agree with one process: no dropout, deterministic kernels, lr not rescaled;
# 97 validation samples are 49 + 48 on two ranks.
EXACT = [*TINY, "model.name=mlp", "model.dropout=0", "run.deterministic=true", "data.val_size=97"]
STEPS = 2 * 256 // 32  # TINY: 2 epochs of 256 samples at an effective batch of 32
STANDALONE = ["--standalone", "--nproc_per_node=2"]

# scripts/train.py that also lets the test see inside every rank.
DUMP_RANKS = '''\
"""scripts/train.py; each rank also saves its final weights and counts gradient all-reduces."""
import os
import sys

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from {{ cookiecutter.package_name }} import loop, parallel, trainer
from {{ cookiecutter.package_name }}.tools.train import train_main

fit, DDP = trainer.fit, parallel.DistributedDataParallel
allreduces = []
read_losses, stop_after = loop.read_losses, int(os.environ.get("STOP_AFTER", 0))


def stopping(run, *args):
    # STOP_AFTER=N (with run.log_every=1): stop after step N as SIGTERM does, to be resumed.
    if run.progress.step == stop_after:
        run.stop.reason = "SIGTERM"
    return read_losses(run, *args)


class CountingDDP(DDP):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_comm_hook(None, self.count)

    @staticmethod
    def count(state, bucket):
        allreduces.append(1)
        return allreduce_hook(state, bucket)


def fit_and_dump(cfg, *args):  # args: train.py's hooks
    result = fit(cfg, *args)
    dump = {
        "model": result["model"].state_dict(),
        "step": result["step"],
        "metrics": result["metrics"],
        "allreduces": len(allreduces),
        "seed": torch.initial_seed(),  # fit seeds each rank on its own
    }
    torch.save(dump, os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".pt"))
    return result


trainer.fit, parallel.DistributedDataParallel = fit_and_dump, CountingDDP
loop.read_losses = stopping
code = train_main(sys.argv[2:])
raise SystemExit(0 if stop_after and code == 75 else code)  # 75: stopped as asked
'''


def child_env(**extra: str) -> dict:
    """The test's environment without torchrun variables, one thread per process (2 cores)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RDZV_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def torchrun(launch: list[str], script, *args: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, str(script), *map(str, args)]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=child_env(**env), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(folder: Path) -> list[dict]:
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(2)]


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def assert_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.fixture(scope="module")
def dump_ranks(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("helper") / "dump_ranks.py"
    path.write_text(DUMP_RANKS)
    return path


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    """The reference: one process, batch 32, two epochs."""
    out = tmp_path_factory.mktemp("one")
    result = fit(load_config(None, [*EXACT, "train.batch_size=32", f"run.output_dir={out}"]))
    return {**result, "model": result["model"].state_dict()}


@pytest.fixture(scope="module")
def two_rank_job(tmp_path_factory, dump_ranks) -> tuple[Path, str]:
    """Two ranks, batch 16 each: the folder of the run (runs/) and of the dumps, and stdout."""
    out = tmp_path_factory.mktemp("two")
    args = [*EXACT, "train.batch_size=16", f"run.output_dir={out / 'runs'}"]
    return out, torchrun(STANDALONE, dump_ranks, out, *args).stdout


@pytest.fixture(scope="module")
def two_ranks(two_rank_job) -> list[dict]:
    """What every rank of the two-rank job ended with."""
    out, stdout = two_rank_job
    assert "effective batch 32" in stdout
    dumps = ranks(out)
    assert_same(dumps[0]["model"], checkpoint.load(out / "runs/default/last.pt")["model"])
    return dumps


@slow
def test_training_under_torchrun_writes_one_run_folder(two_rank_job):
    """The two-rank job the equivalence tests read (scripts/train.py's train_main, seen inside
    its ranks); scripts/train.py itself runs under torchrun in the SIGTERM and SLURM tests."""
    out, stdout = two_rank_job[0] / "runs", two_rank_job[1]
    # Rank 0 alone prints, and writes the run folder, the checkpoints and the run summary.
    assert stdout.count("run default: mlp") == 1 and "cpu x 2" in stdout
    assert stdout.count("epoch 2/2 |") == 1
    assert sorted(p.name for p in out.iterdir()) == [RUNS_LOCK, "default", "runs.csv"]
    # curves.png: drawn at the end of a run of 30 s or more (a loaded machine), with matplotlib
    plot = ["curves.png"] if (out / "default" / "curves.png").exists() else []
    assert sorted(p.name for p in (out / "default").iterdir()) == [
        ".lock",
        "best.pt",
        "config.yaml",
        *plot,
        "last.pt",
        "metrics.csv",
        "run.json",  # written by rank 0 alone
        "step-00000008.pt",
        "step-00000016.pt",
    ]
    assert len((out / "runs.csv").read_text().splitlines()) == 2
    last = checkpoint.load(out / "default/last.pt")
    assert last["progress"]["step"] == STEPS and last["meta"]["world_size"] == 2
    assert len(last["rng"]) == 2  # each rank's RNG streams


# One process joins a one-rank gloo group as train() does (setup, then DDP, whose first use
# imports torch._dynamo and torch.distributed.nn), leaves it, and lists its threads.
LEAVE_GROUP = """
import os
import torch
from torch.nn.parallel import DistributedDataParallel
from {{ cookiecutter.package_name }} import distributed

distributed.setup("cpu")
ddp = DistributedDataParallel(torch.nn.Linear(4, 2))
ddp(torch.ones(2, 4)).sum().backward()
del ddp
distributed.teardown()
tasks = "/proc/self/task"
print(sorted(open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads threads from /proc")
def test_teardown_frees_the_gloo_group_before_interpreter_exit():
    # A group still alive after teardown is torn down during interpreter shutdown, where gloo
    # can abort (a rare SIGABRT under torchrun): its worker and socket threads must be gone.
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    proc = subprocess.run(
        [sys.executable, "-c", LEAVE_GROUP],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = proc.stdout.strip().splitlines()[-1]
    assert "gloo" not in threads, threads


@slow
def test_two_ranks_equal_one_process_with_twice_the_batch(two_ranks, one_process):
    """Rank r reads positions r, r+2, ... of the same order and DDP averages the gradients,
    so 2 x 16 takes the same steps as 1 x 32."""
    rank0, rank1 = two_ranks
    assert_same(rank0["model"], rank1["model"])
    assert rank0["step"] == one_process["step"] == STEPS
    assert_close(rank0["model"], one_process["model"])
    assert (rank0["seed"], rank1["seed"]) == (mix_seed(42, 0), mix_seed(42, 1))
    assert rank0["allreduces"] == STEPS  # one bucket per step: the model is tiny


@slow
def test_evaluation_counts_each_sample_once_over_uneven_shards(two_ranks, one_process):
    expected = one_process["metrics"]
    assert "f1/angle_3" in expected and "macro_f1" in expected  # the per-class metrics too
    for rank in two_ranks:
        assert rank["metrics"]["count"] == expected["count"] == 97
        assert rank["metrics"].keys() == expected.keys()
        for key, value in expected.items():  # from confusion sums: the same on any ranks
            assert rank["metrics"][key] == pytest.approx(value, rel=1e-5), key


@slow
def test_two_ranks_give_one_process_s_ranking_metrics_with_weights_and_the_balanced_sampler(
    tmp_path, dump_ranks
):
    """AUROC, AP and the tuned threshold gather every sample's score from both ranks (an odd
    number of validation rows: uneven shards), with class weights and the balanced sampler
    in training."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(420, 4, generator=g)
    rare = x[:, 0] + 0.7 * torch.randn(420, generator=g) > 1.0
    rows = [
        ",".join(f"{v:.4f}" for v in r) + (",yes" if p else ",no")
        for r, p in zip(x.tolist(), rare.tolist(), strict=True)
    ]
    table = tmp_path / "rare.csv"
    table.write_text("a,b,c,d,y\n" + "\n".join(rows) + "\n")
    exact = [a for a in EXACT if not a.startswith(("data.", "model.width"))]
    args = [
        *exact, "data.name=csv", f"data.path={table}", "data.label=y", "data.val_fraction=0.231",
        "task.class_weights=auto", "data.sampler=balanced", "task.threshold=auto",
        "train.best_metric=auroc",
    ]  # fmt: skip
    one = fit(
        load_config(None, [*args, "train.batch_size=32", f"run.output_dir={tmp_path / 'one'}"])
    )
    torchrun(
        STANDALONE,
        dump_ranks,
        tmp_path,
        *args,
        "train.batch_size=16",
        f"run.output_dir={tmp_path / 'two'}",
    )
    expected = one["metrics"]
    assert expected["count"] % 2 == 1 and 0 < expected["auroc"] < 1
    for rank in ranks(tmp_path):
        assert rank["metrics"].keys() == expected.keys()
        for key, value in expected.items():
            assert rank["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("world", [2, 3, 4])
def test_evaluation_shards_hold_each_sample_once(world):
    shards = [list(ShardedSampler(97, r, world, shuffle=False, even=False)) for r in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(97))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize("size", [256, 97])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("start", [0, 40])
def test_ranks_read_interleaved_positions_of_one_order(size, world, start):
    """Together the ranks read the one-process order, from any start: a batch of B on W ranks
    is a batch of W x B on one process, and a mid-epoch resume works on any world size."""
    one = ShardedSampler(size, seed=5)
    one.set_epoch(3, start=start)
    shards = []
    for rank in range(world):
        sampler = ShardedSampler(size, rank, world, seed=5)
        sampler.set_epoch(3, start=start)
        shards.append(list(sampler))
    assert len({len(shard) for shard in shards}) == 1  # every rank steps as often
    merged = [shards[p % world][p // world] for p in range(world * len(shards[0]))]
    order = list(one)
    assert merged[: len(order)] == order[: len(merged)]
    assert len(merged) - len(order) < world  # padding only fills the last row


def test_nearby_seeds_and_epochs_draw_unrelated_orders():
    """Seeded with seed + epoch, seed 43's epoch k was seed 42's epoch k+1: "mean over seeds"
    then averaged runs that saw the same orders."""

    def order(seed: int, epoch: int, **kwargs) -> tuple:
        sampler = ShardedSampler(64, seed=seed, **kwargs)
        sampler.set_epoch(epoch)
        return tuple(sampler)

    assert order(43, 0) != order(42, 1)
    orders = [order(seed, epoch) for seed in range(10) for epoch in range(10)]
    assert len(set(orders)) == len(orders)
    # The augmentation seeds that come with each sample differ across seeds and epochs too.
    items = [item for s in range(10) for e in range(10) for item in order(s, e, seeded=True)]
    assert len({seed for _, seed in items}) == len(items)


def test_ranks_of_nearby_seeds_get_unrelated_seeds(tiny):
    """Seeded with seed + rank, seed 43's rank 0 was seed 42's rank 1; likewise the loaders'
    worker seeds (seed + 1000 x rank)."""
    dataset = torch.utils.data.TensorDataset(torch.zeros(8, 1), torch.zeros(8))
    seeds, loader_seeds = set(), set()
    for seed in range(10):
        cfg = load_config(None, [*tiny, f"run.seed={seed}"])
        for rank in range(4):
            prepare_process(cfg, DistInfo(rank=rank, world_size=4), torch.device("cpu"))
            seeds.add(torch.initial_seed())
            loader = build_loader(dataset, cfg.data, 2, train=True, seed=seed, rank=rank)
            loader_seeds.add(loader.generator.initial_seed())
    assert len(seeds) == len(loader_seeds) == 40 and not seeds & loader_seeds


@slow
def test_two_nodes_on_loopback_finish_one_run(tmp_path, dump_ranks):
    out, port = tmp_path / "runs", free_port()
    logs, procs = [tmp_path / f"node{n}.log" for n in (0, 1)], []
    try:
        for node, log in enumerate(logs):
            launch = [
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=two-nodes",
            ]
            cmd = [sys.executable, "-m", "torch.distributed.run", *launch, str(dump_ranks)]
            with log.open("w") as f:
                procs.append(
                    subprocess.Popen(
                        [*cmd, str(tmp_path), *TINY, f"run.output_dir={out}"],
                        cwd=ROOT,
                        env=child_env(),
                        stdout=f,
                        stderr=subprocess.STDOUT,
                    )
                )
        codes = [proc.wait(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    text = "\n".join(log.read_text() for log in logs)
    assert codes == [0, 0], text[-4000:]
    assert text.count("run default: cnn") == 1 and "cpu x 2" in text
    assert sorted(p.name for p in out.iterdir()) == [RUNS_LOCK, "default", "runs.csv"]
    rank0, rank1 = ranks(tmp_path)
    assert_same(rank0["model"], rank1["model"])  # BatchNorm statistics too
    assert_same(rank0["model"], checkpoint.load(out / "default/last.pt")["model"])


@slow
def test_two_rank_checkpoint_resumes_in_one_process_and_accumulation_all_reduces_once_a_step(
    tmp_path, dump_ranks, one_process
):
    """2 ranks x 8 x 2 micro-steps stopped after step 5, then 1 x 32 to the end: the weights of
    1 x 32 throughout, and one gradient all-reduce per step, on the last micro-step only.
    (One launch for both: each costs a few seconds.)"""
    out = f"run.output_dir={tmp_path / 'runs'}"
    two = [*EXACT, "train.batch_size=8", "train.grad_accum_steps=2", out]
    proc = torchrun(STANDALONE, dump_ranks, tmp_path, *two, "run.log_every=1", STOP_AFTER="5")
    assert "effective batch 32" in proc.stdout
    rank0, rank1 = ranks(tmp_path)
    assert rank0["allreduces"] == rank1["allreduces"] == 5  # not 2 x 5
    assert_same(rank0["model"], rank1["model"])
    saved = checkpoint.load(tmp_path / "runs/default/last.pt")
    assert saved["progress"]["step"] == 5 and saved["progress"]["epoch_samples"] == 5 * 32
    assert saved["meta"]["world_size"] == 2
    # The same effective batch on one process continues the run exactly.
    result = fit(load_config(None, [*EXACT, "train.batch_size=32", "train.resume=auto", out]))
    assert result["step"] == STEPS and result["epoch"] == 2
    assert_close(result["model"].state_dict(), one_process["model"])


@slow
def test_one_process_checkpoint_resumes_on_two_ranks(tmp_path, dump_ranks):
    args = [*EXACT, "train.batch_size=16", f"run.output_dir={tmp_path / 'runs'}"]
    first = fit(load_config(None, [*args, "train.max_steps=5"]))
    assert first["step"] == 5  # effective batch 16: 16 steps per epoch
    # The same batch per rank on two ranks: effective batch 32 from the sample where it stopped.
    proc = torchrun(STANDALONE, dump_ranks, tmp_path, *args, "train.resume=auto")
    assert "resumed at step 5" in proc.stdout and "effective batch was 16" in proc.stdout
    rest_of_epoch = (256 - 5 * 16) // 32
    rank0, rank1 = ranks(tmp_path)
    assert rank0["step"] == rank1["step"] == 5 + rest_of_epoch + 256 // 32
    assert checkpoint.load(tmp_path / "runs/default/last.pt")["progress"]["step"] == rank0["step"]
    assert_same(rank0["model"], rank1["model"])


# Stand-ins for SLURM's commands: each records its arguments in $STUB_LOG.
STUBS = {
    "srun": """#!/bin/bash
echo "srun $*" >> "$STUB_LOG"
while [[ $1 == -* ]]; do shift; done
echo $$ > "$STUB_DIR/srun.pid"
if [[ -n ${STUB_EXEC:-} ]]; then exec "$@"; fi
""",
    "scontrol": """#!/bin/bash
echo "scontrol $*" >> "$STUB_LOG"
if [[ $1 == show ]]; then printf '%s\\n' $STUB_HOSTS; fi
""",
    # Real scancel signals every process of the job step; here torchrun passes SIGTERM on.
    "scancel": """#!/bin/bash
echo "scancel $*" >> "$STUB_LOG"
kill -TERM "$(cat "$STUB_DIR/srun.pid")"
""",
    "torchrun": """#!/bin/bash
exec "$PYTHON" -m torch.distributed.run "$@"
""",
}


@pytest.fixture
def slurm(tmp_path) -> dict:
    """Environment of a 2-node job of 4 GPUs each, with the SLURM commands stubbed."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    return child_env(
        PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}",
        PYTHON=sys.executable,
        STUB_DIR=str(tmp_path),
        STUB_LOG=str(tmp_path / "calls.log"),
        STUB_HOSTS="node-1 node-2",
        SLURM_JOB_ID="4242",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="node-[1-2]",
        SLURM_GPUS_ON_NODE="4",
        SLURM_CPUS_PER_TASK="32",
        SLURM_SUBMIT_DIR=str(ROOT),
    )


def sbatch_script(env: dict, *args: str, **popen) -> subprocess.Popen:
    """Run the batch script as sbatch would on the first node."""
    return subprocess.Popen(
        ["bash", "scripts/slurm_train.sh", *args], cwd=ROOT, env=env, text=True, **popen
    )


def test_slurm_script_parses_and_passes_shellcheck():
    assert subprocess.run(["bash", "-n", "scripts/slurm_train.sh"], cwd=ROOT).returncode == 0
    header = (ROOT / "scripts/slurm_train.sh").read_text()
    for option in ("--nodes=", "--gpus-per-node=", "--time=", "--signal=B:USR1@120", "--requeue"):
        assert f"#SBATCH {option}" in header
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(["shellcheck", "scripts/slurm_train.sh"], cwd=ROOT, capture_output=True)
    assert proc.returncode == 0, proc.stdout


def test_slurm_script_helps_and_dry_runs_without_slurm(tmp_path):
    """--help and --dry-run work on a laptop: no SLURM command on PATH, no SLURM_* set but
    those given; outside a job the script itself is one line, exit 2, nothing run."""
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no scontrol, srun, torchrun
    done = subprocess.run(["bash", "scripts/slurm_train.sh", "--help"], cwd=ROOT, env=bare,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and "--dry-run prints the srun + torchrun command" in done.stdout
    assert "#SBATCH" not in done.stdout and "set -euo" not in done.stdout
    env = {**bare, "SLURM_JOB_NODELIST": "gpu-3,gpu-4", "SLURM_NNODES": "2",
           "SLURM_GPUS_ON_NODE": "8"}  # fmt: skip
    args = ["bash", "scripts/slurm_train.sh", "--dry-run", "run.name=big", "train.lr=1e-3"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "srun --cpus-per-task=1 torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d "
        "--rdzv-endpoint=gpu-3:29500 --rdzv-id=dry-run scripts/train.py run.name=big "
        "train.lr=1e-3 train.resume=auto\n"
    )
    done = subprocess.run(["bash", "scripts/slurm_train.sh", "run.name=big"], cwd=ROOT,
                          env=bare, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not inside a SLURM job" in done.stderr


def test_slurm_script_runs_torchrun_once_per_node_with_c10d(slurm):
    job = sbatch_script(slurm, "run.name=big", "train.epochs=3", stdout=subprocess.PIPE)
    assert job.wait(timeout=30) == 0
    calls = Path(slurm["STUB_LOG"]).read_text().splitlines()
    assert calls == [
        "scontrol show hostnames node-[1-2]",
        "srun --cpus-per-task=32 torchrun --nnodes=2 --nproc_per_node=4 --rdzv-backend=c10d "
        "--rdzv-endpoint=node-1:29500 --rdzv-id=4242 scripts/train.py run.name=big "
        "train.epochs=3 train.resume=auto",
    ]


def test_slurm_script_refuses_to_run_outside_the_project(slurm, tmp_path):
    job = sbatch_script({**slurm, "SLURM_SUBMIT_DIR": str(tmp_path)}, stderr=subprocess.PIPE)
    assert job.wait(timeout=30) == 2
    assert "submit from the project root" in job.stderr.read()


@slow
def test_slurm_time_limit_saves_requeues_and_the_requeued_job_resumes(slurm, tmp_path):
    """USR1 (sent 120 s before the time limit) -> SIGTERM to torchrun and its workers -> they
    save and exit -> scontrol requeue; the requeued job resumes from that checkpoint."""
    out = tmp_path / "runs"
    env = {
        **slurm,
        "SLURM_NNODES": "1",
        "SLURM_GPUS_ON_NODE": "2",
        "STUB_HOSTS": "127.0.0.1",
        "STUB_EXEC": "1",
        "RDZV_PORT": str(free_port()),
    }
    args = [*TINY, "train.epochs=200", "run.log_every=1", "run.name=job", f"run.output_dir={out}"]
    log = tmp_path / "job.log"
    with log.open("w") as f:
        job = sbatch_script(env, *args, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        # After the first epoch every rank is in the loop, its signal handlers installed.
        while not (out / "job/metrics.csv").exists():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.05)
        job.send_signal(signal.SIGUSR1)
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    text = log.read_text()
    step = checkpoint.load(out / "job/last.pt")["progress"]["step"]
    assert 0 < step < 200 * 8 and f"stopped (SIGTERM) at step {step}" in text, text[-4000:]
    calls = Path(env["STUB_LOG"]).read_text().splitlines()
    assert calls[-2:] == ["scancel --signal=TERM 4242", "scontrol requeue 4242"]

    # The requeued job: the same script and arguments (plus a step limit to end the test).
    with log.open("w") as f:
        job = sbatch_script(
            {**env, "SLURM_RESTART_COUNT": "1"},
            *args,
            f"train.max_steps={step + 2}",
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        assert job.wait(timeout=120) == 0, log.read_text()[-4000:]
    assert f"resumed at step {step}" in log.read_text()
    assert checkpoint.load(out / "job/last.pt")["progress"]["step"] == step + 2
    assert Path(env["STUB_LOG"]).read_text().count("requeue") == 1


# scripts/train.py whose steps take 0.25 s; rank 1 (or RECORD_RANK) records its pid and each
# step it finishes, and rank 1 can be made unable to read checkpoints.
SLOW_RANKS = """\
import os
import sys
import time
from pathlib import Path

import torch

from {{ cookiecutter.package_name }}.checkpoint import files
from {{ cookiecutter.package_name }}.tools.train import train_main
from {{ cookiecutter.package_name }}.errors import CheckpointError

out, rank = Path(sys.argv[1]), int(os.environ["RANK"])
recorded = rank == int(os.environ.get("RECORD_RANK", 1))
clip, load, steps = torch.nn.utils.clip_grad_norm_, files.load, [0]


def slow_clip(*args, **kwargs):
    time.sleep(0.25)
    steps[0] += 1
    if recorded:
        (out / f"rank{rank}.step").write_text(str(steps[0]))
    return clip(*args, **kwargs)


def unreadable(path):
    raise CheckpointError(f"checkpoint {str(path)!r} could not be read (simulated)")


if recorded:
    (out / f"rank{rank}.pid").write_text(str(os.getpid()))
if rank == 1 and os.environ.get("RANK1_CANNOT_READ"):
    files.load = unreadable  # what resume.load_state reads with
torch.nn.utils.clip_grad_norm_ = slow_clip
raise SystemExit(train_main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def slow_ranks(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("helper") / "slow_ranks.py"
    path.write_text(SLOW_RANKS)
    return path


def wait_for(predicate, proc, timeout: float = 120, what: str = ""):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"ended before {what}: {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@slow
def test_a_signal_to_one_rank_stops_every_rank_within_seconds(tmp_path, slow_ranks):
    """Steps of 0.25 s and no log step in the epoch: the ranks still agree to stop within
    about 2 s (distributed.StopVote), not at the end of the epoch."""
    out = tmp_path / "runs"
    args = [*TINY, "data.train_size=2048", "train.epochs=1", "run.log_every=1000"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *STANDALONE, str(slow_ranks)]
    log = tmp_path / "log.txt"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [*cmd, str(tmp_path), *args, f"run.output_dir={out}"],
            cwd=ROOT,
            env=child_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:
        step_file = tmp_path / "rank1.step"
        wait_for(lambda: step_file.exists() and int(step_file.read_text() or 0) >= 4, proc)
        signalled_at = int(step_file.read_text())
        os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    saved = checkpoint.load(out / "default/last.pt")["progress"]["step"]
    assert f"stopped (signal on another rank) at step {saved}" in text, text[-3000:]
    # 64 steps in the epoch; a vote every ~8 steps of 0.25 s.
    assert signalled_at <= saved <= signalled_at + 12, (signalled_at, saved)


@slow
def test_ranks_that_cannot_all_read_the_resume_checkpoint_stop_with_one_line(tmp_path, slow_ranks):
    out = f"run.output_dir={tmp_path / 'runs'}"
    fit(load_config(None, [*TINY, out, "train.max_steps=2"]))
    cmd = [sys.executable, "-m", "torch.distributed.run", *STANDALONE, str(slow_ranks)]
    proc = subprocess.run(
        [*cmd, str(tmp_path), *TINY, out, "train.resume=auto"],
        cwd=ROOT,
        env=child_env(RANK1_CANNOT_READ="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "rank 1 cannot read the checkpoint to resume" in errors[0] and "simulated" in errors[0]


@slow
def test_sigterm_to_torchrun_with_loader_workers_saves_and_resumes(tmp_path):
    """torchrun passes SIGTERM to its workers' process groups, loader workers included; they
    must not die of it before their rank saves."""
    out = tmp_path / "runs"
    args = [
        *TINY,
        "data.num_workers=2",
        "train.epochs=50",
        "run.log_every=1",
        f"run.output_dir={out}",
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", *STANDALONE, "scripts/train.py", *args]
    log = tmp_path / "log.txt"
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=child_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: list((out / "default").glob("step-*.pt")), proc, what="a checkpoint")
        os.killpg(proc.pid, signal.SIGTERM)  # as SLURM's scancel: every process of the job
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "DataLoader worker" not in text, text[-3000:]
    saved = checkpoint.load(out / "default/last.pt")["progress"]["step"]
    assert f"stopped (SIGTERM) at step {saved}" in text, text[-3000:]
    assert 0 < saved < 50 * 8
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *STANDALONE,
            "scripts/train.py",
            *args,
            "train.resume=auto",
            f"train.max_steps={saved + 3}",
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed at step {saved}" in resumed.stdout
    assert checkpoint.load(out / "default/last.pt")["progress"]["step"] == saved + 3


@slow
@pytest.mark.parametrize("killed", [1, 0])
def test_kill_9_of_one_rank_is_one_line_on_the_other_and_the_run_resumes(
    tmp_path, slow_ranks, killed
):
    """A rank's process killed mid-training: the rank left says so in one line (no gloo
    traceback), exits 75 (rerun to resume), and the checkpoints saved before resume."""
    out, logs = tmp_path / "runs", tmp_path / "logs"
    args = [*TINY, "train.epochs=4", "run.log_every=1000", f"run.output_dir={out}"]
    launch = [*STANDALONE, "--redirects=3", f"--log-dir={logs}"]  # each rank's output apart
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, str(slow_ranks)]
    env = child_env(RECORD_RANK=str(killed))
    report = tmp_path / "torchrun.txt"  # torchrun's own: each rank's exit code
    with report.open("w") as f:
        proc = subprocess.Popen([*cmd, str(tmp_path), *args], cwd=ROOT, env=env, stderr=f)
    try:
        step_file = tmp_path / f"rank{killed}.step"
        # 8 steps an epoch (256 samples, 2 x 16 a step): mid epoch 2, after a checkpoint.
        wait_for(lambda: step_file.exists() and int(step_file.read_text() or 0) >= 12, proc)
        os.kill(int((tmp_path / f"rank{killed}.pid").read_text()), signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    survivor = next(logs.rglob(f"attempt_0/{1 - killed}"))
    stderr = (survivor / "stderr.log").read_text()
    assert stderr.splitlines() == [
        f"error: rank {killed} is gone (rank {1 - killed} lost its connection to it); the last "
        "checkpoint is kept; rerun with train.resume=auto to continue from it"
    ], stderr[-3000:]
    assert f"rank      : {1 - killed} (local_rank: {1 - killed})\n  exitcode  : 75" in (
        report.read_text()
    )
    for path in (out / "default").glob("*.pt"):
        checkpoint.check_training_state(checkpoint.load(path), path)  # intact
    saved = checkpoint.load(out / "default/last.pt")["progress"]["step"]
    assert saved == 8
    resumed = run_script("scripts/train.py", *args, "train.resume=auto", "train.max_steps=10")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed at step {saved}" in resumed.stdout
