"""The documented path is the tested path: every command block of the template README, the
baked README, AGENTS.md and docs/ runs as written, in the order a reader meets it (issue 43).

The collector is the forty lines below, not a tool: pytest-markdown-docs and pytest-examples
run Python blocks only, and mktestdocs runs a shell block with `bash -e -u -c` in the test's
own folder and environment, one language at a time, blind to the line before a fence: it has
no project folder per document, no reader's order across `bash`/`sh`/`console` blocks and no
way to see a block's mark. A block that needs what these machines lack says so on the line
before its fence, `<!-- doc-runner: needs gpu -->`, from the closed vocabulary NEEDS (the
baked docs/testing.md explains it); the tests check the mark instead of running the block.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import TEMPLATE, copy_template

SHELL = {"bash", "sh", "shell", "console"}
NEEDS = {  # the marks' closed vocabulary, with what shows a block needs it
    "gpu": r"gpu[-_]check",
    "cluster": r"\bsbatch\b|--slurm\b|--nnodes\b",
    # pip and make env/install reach an index; the fine-tuning examples, the model hub
    "network": r"\bpip (install|download)\b|\bmake (env|install)\b|finetune_|hf_text",
    "docker": r"^docker ",
    "browser": r"^tensorboard ",  # a server that runs until stopped
    "minutes": r"^make test",  # a whole suite: test_baked_project_passes_its_own_suite runs it
}
MARK = re.compile(r"^[ \t]*<!-- doc-runner: (.*?) -->[ \t]*$", re.M)  # a line of its own
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SMOKE = "train.max_steps=2"  # $SMOKE_OVERRIDES: every documented run two steps long


@dataclasses.dataclass
class Block:
    doc: str
    line: int  # of the opening fence
    needs: tuple[str, ...]  # from its mark; () = run it
    commands: list[str]


def collect(text: str, doc: str) -> list[Block]:
    """The shell blocks of one Markdown text, in order. A mark that stands before no shell
    fence, or names a need outside NEEDS, is an error: a typo must not hide a block."""
    blocks, marked = [], set()
    for fence in FENCE.finditer(text):
        if fence[1] not in SHELL:
            continue
        line = text.count("\n", 0, fence.start()) + 1
        above = text[: max(fence.start() - 1, 0)].rpartition("\n")[2]  # the line before
        mark = MARK.fullmatch(above)
        needs: tuple[str, ...] = ()
        if mark:
            marked.add(line - 1)
            words = mark[1].removeprefix("needs ")
            needs = tuple(word.strip() for word in words.split(","))
            unknown = [w for w in needs if w not in NEEDS] if words != mark[1] else [mark[1]]
            assert not unknown, f"{doc}:{line - 1}: {unknown} not in {sorted(NEEDS)}"
        body = fence[2].replace("\\\n", " ")  # a continued line is one command
        lines = body.splitlines()
        if fence[1] == "console":  # the prompt's lines; the rest is output
            lines = [row[2:] for row in lines if row.startswith("$ ")]
        commands = [c for c in lines if c.strip() and not c.lstrip().startswith("#")]
        # Each command runs in a shell of its own from the project's root.
        assert not [c for c in commands if re.match(r"\s*(cd|export) ", c)], (doc, line)
        blocks.append(Block(doc, line, needs, commands))
    stray = {text.count("\n", 0, m.start()) + 1 for m in MARK.finditer(text)} - marked
    assert not stray, f"{doc}: a doc-runner mark on line {sorted(stray)} marks no shell block"
    return blocks


def reader_order(project: Path) -> list[str]:
    """README.md, then the pages in the order the README names them, then any other page."""
    named = re.findall(r"\bdocs/[\w.-]+\.md\b", (project / "README.md").read_text())
    pages = sorted(p.relative_to(project).as_posix() for p in project.rglob("*.md"))
    pages = [p for p in pages if p not in ("README.md", "AGENTS.md")]
    named = [p for p in dict.fromkeys(named) if p in pages]
    return ["README.md", *named, *(p for p in pages if p not in named)]


def check_marks(blocks: list[Block]) -> list[str]:
    """A block showing a need carries its mark, and a mark names a need the block shows."""
    problems = []
    for block in blocks:
        text = "\n".join(block.commands)
        shown = {need for need, sign in NEEDS.items() if re.search(sign, text, re.M)}
        if shown - set(block.needs) or (block.needs and not shown & set(block.needs)):
            problems.append(
                f"{block.doc}:{block.line}: needs {sorted(shown)}, marked {block.needs}"
            )
    return problems


def counts(blocks: list[Block]) -> dict[str, int]:
    out = {"blocks": len(blocks), "run": sum(not b.needs for b in blocks)}
    for block in blocks:
        for need in block.needs:
            out[need] = out.get(need, 0) + 1
    return out


def test_the_collector_reads_blocks_commands_and_marks():
    text = (
        "# t\n\n```bash\na --x \\\n    --y   # both\n# a comment\n\nb\n```\n\n```python\nc\n```\n"
        "<!-- doc-runner: needs gpu, network -->\n```sh\nd\n```\n"
        "```console\n$ e\noutput\n```\n"
    )
    blocks = collect(text, "t.md")
    assert [(b.line, b.needs, b.commands) for b in blocks] == [
        (3, (), ["a --x      --y   # both", "b"]),
        (15, ("gpu", "network"), ["d"]),
        (18, (), ["e"]),
    ]
    with pytest.raises(AssertionError, match="marks no shell block"):
        collect("<!-- doc-runner: needs gpu -->\n\n```bash\nd\n```\n", "t.md")
    with pytest.raises(AssertionError, match=r"\['gpus'\] not in"):
        collect("<!-- doc-runner: needs gpus -->\n```bash\nd\n```\n", "t.md")
    with pytest.raises(AssertionError, match="not in"):
        collect("<!-- doc-runner: gpu -->\n```bash\nd\n```\n", "t.md")
    assert check_marks(collect("```bash\nsbatch x.sh\n```\n", "t.md"))
    assert check_marks(collect("<!-- doc-runner: needs gpu -->\n```bash\nls\n```\n", "t.md"))
    made = "```bash\ntrain.py run.name=a\neval.py checkpoints/a/best.pt\n```\n"
    assert not follows_the_readme(collect(made, "t.md"))
    assert follows_the_readme(collect(made.replace("/a/", "/default/"), "t.md"))


@pytest.mark.parametrize("answers", [{}, {"preset": "lean"}, {"docker": "yes"}], ids=str)
def test_every_shell_block_runs_or_is_marked_with_what_it_needs(bake, answers):
    """In the template README and a bake's pages (feature marks resolved): each block that
    needs a GPU, a cluster, the network, docker, a browser or minutes says so, and no other."""
    project = bake(**answers)
    blocks = collect((TEMPLATE / "README.md").read_text(), "template README.md")
    for page in [*reader_order(project), "AGENTS.md"]:
        blocks += collect((project / page).read_text(), page)
    assert not check_marks(blocks)
    found = counts(blocks)
    assert found["run"] > found["blocks"] / 2, found  # marks stay few
    assert ("docker" in found) == (answers.get("docker") == "yes"), found


def test_the_marks_are_explained_in_the_baked_testing_page(bake):
    page = (bake() / "docs" / "testing.md").read_text()
    assert "`<!-- doc-runner: needs X -->`" in page and "SMOKE_OVERRIDES" in page
    assert not [need for need in NEEDS if f"| `{need}` |" not in page]


def run(command: str, cwd: Path, env: dict) -> tuple[int, str, float]:
    """`command` in bash from `cwd`: its exit code, the end of its output, and the CPU seconds
    it and the processes it waited for used (the runner's cost, whatever the machine's load)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            ["/bin/bash", "-c", command], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        timer = threading.Timer(600, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(max(0, out.seek(0, os.SEEK_END) - 3000))
        tail = out.read().decode(errors="replace")
    return proc.returncode, tail, usage.ru_utime + usage.ru_stime


def run_chain(project: Path, blocks: list[Block], log: list) -> str | None:
    """The unmarked blocks' commands in order, each in a shell of its own from `project`;
    the first failure, or None. A path given to --out/--json must exist afterwards."""
    env = {
        **os.environ,
        "PYTHONPATH": str(project),  # for `make install`: no package index here
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SMOKE_OVERRIDES": SMOKE,
        "OMP_NUM_THREADS": "1",
    }
    for block in (b for b in blocks if not b.needs):
        for command in block.commands:
            start = time.monotonic()
            code, tail, cpu = run(command, project, env)
            log.append((block.doc, block.line, command, time.monotonic() - start, cpu))
            where = f"{block.doc}:{block.line}: {command}"
            if code != 0:
                return f"{where}\nexit {code}\n{tail}"
            outputs = re.findall(r"--(?:out|json) (\S+)", command)
            missing = [path for path in outputs if not (project / path).exists()]
            if missing:
                return f"{where}\nwrote no {missing}"
    return None


def follows_the_readme(blocks: list[Block]) -> bool:
    """Whether a page's commands use a run folder none of them makes (after-training.md
    evaluates checkpoints/default): then it starts where the README left its reader."""
    text = "\n".join(command for block in blocks if not block.needs for command in block.commands)
    used = set(re.findall(r"(?<![\w/])checkpoints/([\w.-]+)", text))
    return bool(used - set(re.findall(r"(?:run\.name=|--name )([\w.-]+)", text)))


def cost(blocks: list[Block]) -> int:
    """A rough measure of a chain's time: its commands, a sweep or a torchrun as five."""
    commands = [command for block in blocks if not block.needs for command in block.commands]
    return sum(5 if re.search(r"sweep\.py|torchrun", command) else 1 for command in commands)


@pytest.mark.slow
def test_every_documented_command_runs_as_written(bake, tmp_path):
    """The README runs in a full bake; a page that uses its runs follows it in a copy of that
    project, any other page in a fresh bake of its own, as AGENTS.md; the template README in a
    copy of the template. Two at a time, each run two steps long ($SMOKE_OVERRIDES)."""
    log: list = []
    project = bake()  # cookiecutter changes folders: every bake before the threads start
    chains = {}  # name -> (its project, or None: a copy of the README's; its blocks)
    for page in reader_order(project)[1:]:
        blocks = collect((project / page).read_text(), page)
        if any(not block.needs for block in blocks):
            chains[page] = (None if follows_the_readme(blocks) else bake(), blocks)
    agents = bake()
    chains["AGENTS.md"] = (agents, collect((agents / "AGENTS.md").read_text(), "AGENTS.md"))
    readme = collect((TEMPLATE / "README.md").read_text(), "template README.md")
    if any(not block.needs for block in readme):
        chains["template README.md"] = (copy_template(tmp_path / "template"), readme)

    def readme_then_its_followers() -> list:
        failures = [
            run_chain(project, collect((project / "README.md").read_text(), "README.md"), log)
        ]
        for page, (where, blocks) in chains.items():
            if where is None and failures[0] is None:
                copy = shutil.copytree(project, tmp_path / page.replace("/", "-") / project.name)
                failures.append(run_chain(copy, blocks, log))
        return failures

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(readme_then_its_followers)]
        # The longest first, so that the two workers end together.
        alone = sorted((c for c in chains.values() if c[0]), key=lambda c: -cost(c[1]))
        jobs += [pool.submit(run_chain, *chain, log) for chain in alone]
        failures = [f for f in jobs[0].result() + [job.result() for job in jobs[1:]] if f]
    for doc, line, command, seconds, cpu in log:
        print(f"{seconds:6.1f} s {cpu:6.1f} s CPU  {doc}:{line}  {command[:90]}")
    cpu = sum(entry[-1] for entry in log)
    print(f"{len(log)} commands in {time.monotonic() - start:.0f} s, {cpu:.0f} s of CPU")
    assert not failures, "\n\n".join(failures)
    assert (project / "checkpoints" / "default" / "predictions.csv").is_file()
