"""Slurm job arrays on a real scheduler: a throwaway single-node cluster (Debian's slurmctld, slurmd and
munged on loopback, evalpipe/devtools/slurmcluster.py) runs `sbatch --array=0-3`; one task is cancelled
mid-run and requeued, and every index runs to completion exactly once.

Skipped, with the reason, where the cluster cannot start (`make slurm-check` installs the packages on
Debian as root, and says whether the cluster starts)."""

import time

import pytest

from evalpipe.devtools.slurmcluster import SlurmCluster, SlurmUnavailable

pytestmark = pytest.mark.e2e

# One array task: it says it started, works a little, and says it finished; appending, so a second run shows.
TASK = """#!/bin/sh
echo "$SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT" >> "started-$SLURM_ARRAY_TASK_ID"
sleep 2
echo "$SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT" >> "done-$SLURM_ARRAY_TASK_ID"
"""


@pytest.fixture(scope="module")
def slurm():
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmUnavailable as e:
        pytest.skip(f"no Slurm cluster: {e}")
    try:
        yield cluster
    finally:
        cluster.close()


def test_array_task_cancelled_mid_run_and_requeued_runs_once(slurm, tmp_path):
    script = tmp_path / "task.sh"
    script.write_text(TASK)
    job = slurm.submit(script, "--array=0-3", "--cpus-per-task=1", f"--output={tmp_path}/%A_%a.out", cwd=tmp_path)

    tasks = slurm.wait(job, 20, until=lambda task: task.state == "RUNNING", index=1)
    if slurm.cpus >= 2:  # one CPU a task: the node runs two at once
        assert sum(task.state == "RUNNING" for task in tasks.values()) >= 2, tasks
    deadline = time.monotonic() + 10
    while not (tmp_path / "started-1").exists():
        assert time.monotonic() < deadline, "task 1 runs but its script did not start"
        time.sleep(0.05)
    slurm.cancel(job, 1)
    tasks = slurm.wait(job, 20, index=1)
    assert tasks[1].state == "CANCELLED"
    assert not (tmp_path / "done-1").exists(), "task 1 finished before it was cancelled"

    slurm.requeue(job, 1)
    tasks = slurm.wait(job, 30)
    assert {i: (task.state, task.exit_code) for i, task in tasks.items()} == {i: ("COMPLETED", "0:0") for i in range(4)}
    assert [task.restarts for _, task in sorted(tasks.items())] == [0, 1, 0, 0]
    for i in range(4):
        assert (tmp_path / f"done-{i}").read_text() == f"{i} 4\n"  # finished exactly once, knowing the count
        assert (tmp_path / f"started-{i}").read_text() == f"{i} 4\n" * (2 if i == 1 else 1)
