"""scripts/train.py --profile [STEPS]: torch.profiler over STEPS optimizer steps after a
warm-up, on rank 0, into a new folder of the run folder (profile/, then profile-2/, ...:
never over an earlier one): the trace (TensorBoard's profiler plugin and ui.perfetto.dev
open it), the top operators by time (ops.txt) and on CUDA a memory snapshot (memory.pickle,
for pytorch.org/memory_viz). Training goes on unchanged around it: the loop calls the
profiler after each step (loop.Loop.hooks), nothing more."""

from __future__ import annotations

from pathlib import Path

import torch

WARMUP = 3  # steps left out first: the first steps allocate, tune kernels and compile
MEMORY_EVENTS = 100_000  # allocation events the CUDA memory snapshot keeps


class StepProfiler:
    """A loop hook: profiles steps WARMUP+1 .. WARMUP+steps of this process (rank 0)."""

    def __init__(self, steps: int):
        self.steps, self.seen, self.folder, self.start_step = steps, 0, None, 0
        self.profiler: torch.profiler.profile | None = None
        self.cuda = False

    def __call__(self, loop) -> None:
        if not loop.dist.is_main or self.seen > WARMUP + self.steps:
            return
        self.seen += 1
        if self.seen == WARMUP:  # the next step is the first profiled
            self._start(loop.trainee.model, loop.run_dir)
            self.start_step = loop.progress.step
        elif self.profiler is not None:
            self.profiler.step()
            if self.seen == WARMUP + self.steps:
                self.finish()

    def _start(self, model, run_dir: Path) -> None:
        self.cuda = next(model.parameters()).is_cuda
        self.folder = _new_folder(run_dir)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_EVENTS)
        self.profiler = torch.profiler.profile(
            activities=activities,
            record_shapes=True,
            # Memory comes from the CUDA snapshot: torch's own per-operator memory warns of
            # every block allocated before the profile began.
            profile_memory=False,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(self.folder)),
        )
        self.profiler.start()

    def finish(self) -> None:
        """Stop and write; the run's end calls it too (a run shorter than the profile)."""
        if self.profiler is None:
            return
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        steps = max(self.seen - WARMUP, 1)
        key = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=key, row_limit=25)
        (self.folder / "ops.txt").write_text(f"{steps} steps profiled\n{table}\n")
        lines = [f"profile of {steps} steps after step {self.start_step}: {self.folder}"]
        lines.append("  trace: tensorboard --logdir <it>; its .pt.trace.json: ui.perfetto.dev")
        lines.append(f"  top operators by time: {self.folder / 'ops.txt'}")
        if self.cuda:
            torch.cuda.memory._dump_snapshot(str(self.folder / "memory.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
            lines.append("  memory snapshot: memory.pickle; drag it onto pytorch.org/memory_viz")
        print("\n".join(lines), flush=True)


def _new_folder(run_dir: Path) -> Path:
    """profile/, profile-2/, ...: the first that does not exist, made now."""
    run_dir.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        folder = run_dir / ("profile" if n == 1 else f"profile-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1
