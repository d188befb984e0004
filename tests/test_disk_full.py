"""A full disk or an unwritable output folder: one line, exit 74, and no finished answer lost."""

import ctypes
import ctypes.util
import errno
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from evalpipe.devtools.testserver import Reply
from evalpipe.errors import EXIT_UNWRITABLE, OutputUnwritable
from evalpipe.store import jsonl

from .conftest import ROOT, SAMPLE, judged_rows, read_jsonl, write_jsonl

NOBODY = 65534
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER = 1, 2, 3


def run_script(script, *args, env, cwd, **how):
    """A stage script as a subprocess; `how`: more subprocess.run arguments (preexec_fn, user, group)."""
    return subprocess.run(
        [sys.executable, str(ROOT / f"{script}.py"), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        **how,
    )


def assert_one_error_line(proc, stage, *parts):
    assert proc.returncode == EXIT_UNWRITABLE, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith(f"{stage}: error: ")]
    assert len(errors) == 1, proc.stderr
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


# ---- Appender: a write cut short


def test_a_write_cut_short_leaves_the_file_exactly_as_before(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    with jsonl.Appender(path) as out:
        out.append({"idx": "a", "text": "first"})
        before = path.read_bytes()
        real_write = os.write
        calls = []

        def disk_fills_up(fd, data):  # as ENOSPC does: a prefix gets written, then nothing
            calls.append(len(data))
            if len(calls) == 1:
                return real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "write", disk_fills_up)
        with pytest.raises(OutputUnwritable) as failed:
            out.append({"idx": "b", "text": "x" * 1000})
        monkeypatch.setattr(os, "write", real_write)
        assert len(calls) == 2  # the short write, then the rest of the row
        assert path.read_bytes() == before
        message = str(failed.value)
        assert message.startswith(
            f"cannot write {path}: No space left on device; free space on the file system "
            f"holding {tmp_path} (e.g. df -h {tmp_path}), then rerun the same command"
        )
        out.append({"idx": "c", "text": "after"})  # the same appender goes on at the right place
    assert [row["idx"] for _, row in jsonl.iter_rows(path)] == ["a", "c"]


def test_permission_errors_say_which_folder_to_fix(tmp_path):
    err = OutputUnwritable(tmp_path / "new" / "deeper" / "score.json", OSError(errno.EROFS, os.strerror(errno.EROFS)))
    assert str(err) == (
        f"cannot write {tmp_path}/new/deeper/score.json: Read-only file system; the folder {tmp_path} is read-only "
        "or not writable by this user: fix its permissions or choose another output folder "
        "(--outputs-dir, make's OUTPUTS=)"
    )


# ---- a disk that fills up mid-run, for real


def padded(request):
    return Reply(content="x" * 3000, delay=0.05)  # rows of nearly one size: the limit can fall between two rows


def limit_file_size(limit):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # beyond it write() fails with EFBIG

    return preexec


@pytest.mark.e2e
def test_disk_full_mid_run_keeps_the_rows_in_flight_and_the_rerun_adds_them(server, env, tmp_path):
    server.handler = padded
    sizes = tmp_path / "sizes" / "infer.jsonl"
    run_script("infer", "--model", "m", "--slim", "--output", sizes, env=env, cwd=tmp_path).check_returncode()
    row_sizes = [len(line) for line in sizes.read_bytes().splitlines(keepends=True)]
    limit = (4 * max(row_sizes) + 5 * min(row_sizes)) // 2  # 4 rows fit, 5 never do, nor a row in what is left
    assert 4 * max(row_sizes) < limit < 5 * min(row_sizes)

    out = tmp_path / "run" / "infer.jsonl"
    rescue = jsonl.rescue_path(out)
    command = ("infer", "--model", "m", "--slim", "--output", out, "--workers", "3")
    before = len(server.chat_requests())
    try:
        proc = run_script(*command, env=env, cwd=tmp_path, preexec_fn=limit_file_size(limit))
        line = assert_one_error_line(
            proc,
            "infer",
            f"cannot write {out}: File too large; free space on the file system holding {out.parent}",
            "rerun the same command",
            f"3 finished answers were kept in {rescue}",
        )
        assert "lost" not in line
        assert out.read_bytes().endswith(b"\n")
        on_disk = [row["idx"] for row in read_jsonl(out)]  # every line parses
        kept = [row["idx"] for row in read_jsonl(rescue)]
        assert len(on_disk) == 4
        # the row that did not fit and the two calls still in flight; no call started after the failure
        assert len(kept) == 3 and not set(kept) & set(on_disk)
        assert len(server.chat_requests()) - before == 7

        proc = run_script(*command, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "recovered 3 rows" in proc.stderr and not rescue.exists()
        assert "5 to run" in proc.stderr
        assert Counter(row["idx"] for row in read_jsonl(out)) == Counter(row["idx"] for row in read_jsonl(sizes))
        asked = Counter(json.dumps(r.messages) for r in server.chat_requests()[before:])
        assert len(asked) == 12 and set(asked.values()) == {1}  # no task was asked twice
    finally:
        rescue.unlink(missing_ok=True)


# ---- an output folder this user cannot write


def _drop_file_permission_override(libc):
    def preexec():
        for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")

    return preexec


def _child_works(probe_dir: Path, **how) -> bool:
    """Can a child started this way run the project's Python, import the stages, and not write a 0555 folder?"""
    code = (
        "import sys, os; sys.path.insert(0, sys.argv[1]); import evalpipe.stages.infer, evalpipe.stages.score; "
        "ok = not os.access(sys.argv[2], os.W_OK); sys.exit(0 if ok else 1)"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(ROOT), str(probe_dir)],
            cwd=probe_dir,
            capture_output=True,
            timeout=60,
            **how,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


@pytest.fixture
def unprivileged(tmp_path):
    """(workspace, how to start a child that file permissions apply to). Root ignores file modes, so as
    root the child runs as nobody (65534) or, when nobody cannot reach the venv (under /root), as root
    without CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER."""
    if os.geteuid() != 0:
        yield tmp_path, {}
        return
    workspace = Path(tempfile.mkdtemp(prefix="evalpipe-unwritable-"))
    os.chmod(workspace, 0o755)  # tmp_path's parents are root's only
    probe = workspace / "probe"
    probe.mkdir(mode=0o555)
    try:
        as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        without_caps = {"preexec_fn": _drop_file_permission_override(libc)}
        for how in (as_nobody, without_caps):
            if _child_works(probe, **how):
                yield workspace, how
                break
        else:
            pytest.skip(
                f"running as root, and neither uid {NOBODY} can run {sys.executable} with the project "
                f"{ROOT} (a parent folder is closed to it) nor can capabilities be dropped: "
                "root would ignore the folder's mode"
            )
    finally:
        for folder, _, _ in os.walk(workspace):
            os.chmod(folder, 0o755)
        shutil.rmtree(workspace)


@pytest.mark.e2e
def test_unwritable_output_folders_end_infer_and_score_with_one_line(server, env, unprivileged):
    workspace, how = unprivileged
    run_dir = workspace / "outputs" / "clbench" / "m" / "run-1"
    run_dir.mkdir(parents=True)
    write_jsonl(run_dir / "judge.jsonl", judged_rows([1, 1, 1]))
    os.chmod(run_dir / "judge.jsonl", 0o644)
    os.chmod(run_dir, 0o555)
    kwargs = {"env": env, "cwd": workspace, **how}

    proc = run_script("infer", "--model", "m", "--outputs-dir", "outputs", "--max-samples", "3", **kwargs)
    assert_one_error_line(
        proc,
        "infer",
        "cannot write outputs/clbench/m/run-1/infer.jsonl.lock: Permission denied; "
        "the folder outputs/clbench/m/run-1 is read-only or not writable by this user: fix its permissions "
        "or choose another output folder (--outputs-dir, make's OUTPUTS=)",
    )
    assert server.chat_requests() == []

    proc = run_script(
        "score", "--model", "m", "--outputs-dir", "outputs", "--data", SAMPLE, "--max-samples", "3", **kwargs
    )
    assert_one_error_line(
        proc,
        "score",
        "cannot write outputs/clbench/m/run-1/items.json: Permission denied; "
        "the folder outputs/clbench/m/run-1 is read-only",
    )
    assert sorted(p.name for p in run_dir.iterdir()) == ["judge.jsonl"]


@pytest.mark.e2e
def test_a_read_only_output_file_ends_infer_with_one_line(server, env, unprivileged):
    workspace, how = unprivileged
    out = workspace / "o" / "infer.jsonl"
    out.parent.mkdir()
    os.chmod(out.parent, 0o777)  # the folder is writable (lock, manifest), the output itself is not
    out.write_bytes(b"")
    os.chmod(out, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    kwargs = {"env": env, "cwd": workspace, **how}
    proc = run_script("infer", "--model", "m", "--output", out, "--max-samples", "2", **kwargs)
    assert_one_error_line(proc, "infer", f"cannot write {out}: Permission denied")
    assert out.read_bytes() == b""
