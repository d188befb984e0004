"""A throwaway single-node Slurm cluster on loopback, for the tests that run shards as a job array.

    python -m evalpipe.devtools.slurmcluster check    # start it, run a 2-task array, stop it
    python -m evalpipe.devtools.slurmcluster serve    # start it, print SLURM_CONF, run until Ctrl-C

Debian's slurmctld, slurmd and munged run as child processes, as root, entirely inside a temporary folder
the cluster owns: its own munge key and socket, its own slurm.conf (ports chosen free on loopback, no cgroups,
no accounting), state, spool and logs. No Slurm or munge file in /etc is read or written. The folder, the
daemons and the jobs' processes are all gone when the cluster closes; the daemons also stop when the process
that started them dies, and what its jobs left then, the next cluster to start ends.

`make slurm-check` installs the packages when it can (Debian, as root); where the cluster cannot start,
SlurmUnavailable says why, with the end of the log that shows it, so that a test can skip with that reason.
"""

import argparse
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import sigterm_as_interrupt
from ..pipeline import die_with_parent
from .localmodel import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scancel", "scontrol", "squeue", "sinfo")
# A task in one of these states has ended (and is not COMPLETING: scontrol shows that state until its
# processes are gone, so a task seen here can be requeued at once).
ENDED = frozenset(
    "COMPLETED CANCELLED FAILED TIMEOUT NODE_FAIL PREEMPTED BOOT_FAIL DEADLINE OUT_OF_MEMORY SPECIAL_EXIT".split()
)
# A requeued job waits this long (plus a second) before it may start again: Slurm's default is 120 s, and
# slurmd refuses less than 5 (it then keeps the default).
CRED_EXPIRE = 5
PREFIX = "evalpipe-slurm-"  # of the cluster's folder, in the temporary directory
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # from <linux/prctl.h>


class SlurmUnavailable(RuntimeError):
    """The cluster cannot start here; the message says why (a test skips with it)."""


class SlurmError(RuntimeError):
    """A Slurm command failed or a wait ran out of time on a running cluster (a test fails with it)."""


@dataclass(frozen=True)
class Task:
    """One array task as scontrol shows it."""

    job_id: str  # the task's own job id (scancel and scontrol also take ARRAYJOB_INDEX)
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, ...
    exit_code: str  # "0:0": the script's exit status, then the signal that ended it
    restarts: int  # how often it was requeued

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def unavailable() -> str | None:
    """Why the cluster cannot start here (None when it may), without starting anything."""
    missing = [name for name in (*DAEMONS, "mungekey", *CLIENTS) if shutil.which(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed: `make slurm-check` installs Debian's slurmctld, slurmd, "
            "slurm-client and munge when run as root on Debian"
        )
    if os.geteuid() != 0:
        return "the throwaway Slurm cluster runs slurmd, which starts jobs, as root: run the tests as root"
    return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").rstrip()
    except OSError:
        return f"({path.name}: nothing written)"
    return f"end of {path.name}:\n" + "\n".join(text.splitlines()[-lines:])


def _prctl(option: int, value: int | ctypes.c_void_p) -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(option, value) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """A process's command name and the fields of /proc/PID/stat after it (state, parent, ...); None if gone."""
    try:
        name, _, rest = (Path("/proc") / str(pid) / "stat").read_text().partition(" (")[2].rpartition(") ")
    except OSError:
        return None
    return name, rest.split()


def _started(pid: int) -> str | None:
    """When the process started (clock ticks since boot: with its pid, a name no later process reuses); None
    once it has ended, also while it is a zombie."""
    stat = _stat(pid)
    return stat[1][19] if stat and stat[1][0] not in "ZX" else None


def _children() -> dict[int, str]:
    """This process's children (pid: command name), zombies included."""
    stats = {int(proc.name): _stat(proc.name) for proc in Path("/proc").iterdir() if proc.name.isdigit()}
    return {pid: stat[0] for pid, stat in stats.items() if stat and stat[1][1] == str(os.getpid())}


def _using(conf: Path) -> list[int]:
    """The processes with SLURM_CONF=conf in their environment (zombies have none)."""
    mark = f"\0SLURM_CONF={conf}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in b"\0" + (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _end_stale_clusters() -> None:
    """The clusters whose owner died without closing them (SIGKILL): the daemons died with it, but each
    running job's slurmstepd retries its report for an hour; end them, and remove the folder."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            pid, started = (folder / "owner").read_text().split()
        except (OSError, ValueError):
            continue  # being set up, or not a cluster's
        if _started(int(pid)) == started:
            continue  # its owner still runs
        for stray in _using(folder / "slurm.conf"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(stray, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def _indices(spec: str) -> list[int]:
    """scontrol's ArrayTaskId: "3", or the still-pending rest of an array as "1-3,5" (with "%2" as a limit)."""
    found: list[int] = []
    for part in spec.split("%", 1)[0].split(","):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


class SlurmCluster:
    """Use as a context manager: starts the cluster and waits until its node is idle; always stops it."""

    def __init__(self, start_timeout: float = 30.0):
        self.start_timeout = start_timeout
        self.dir = Path()
        self.conf = Path()
        self.env: dict[str, str] = {}
        self.partition = "evalpipe"
        self.node = "localhost"
        self.cpus = 0  # the node's, as slurmd counts them
        self._daemons: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self._subreaper: int | None = None

    # ---- start and stop

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> "SlurmCluster":
        """Start the cluster (SlurmUnavailable says why it cannot); close() stops it, also after a failed start."""
        if self._daemons:
            raise RuntimeError("this cluster is already running")
        reason = unavailable()
        if reason:
            raise SlurmUnavailable(reason)
        _end_stale_clusters()
        # munged requires the folders on its socket's path to be searchable by everyone
        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX))
        self.dir.chmod(0o755)
        try:
            (self.dir / "owner").write_text(f"{os.getpid()} {_started(os.getpid())}\n")
            # slurmd starts each job's slurmstepd as an orphan: adopt them, to reap them in close() (where init
            # does not reap, as in many containers, they would stay behind as zombies)
            previous = ctypes.c_int()
            _prctl(PR_GET_CHILD_SUBREAPER, ctypes.cast(ctypes.pointer(previous), ctypes.c_void_p))
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            self._subreaper = previous.value
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        munge = self.dir / "munge"
        munge.mkdir(mode=0o755)
        for sub in ("state", "spool", "tmp"):
            (self.dir / sub).mkdir()
        key = munge / "munge.key"
        self._setup_run(["mungekey", "--create", f"--keyfile={key}"], "mungekey")
        socket_path = munge / "munge.socket"
        self._spawn(
            "munged",
            ["munged", "--foreground", f"--key-file={key}", f"--socket={socket_path}"]
            + [f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}"],
        )
        while not socket_path.exists():
            self._check_alive(deadline, "munged did not create its socket")
            time.sleep(0.05)

        self.cpus, memory = self._hardware()
        self.conf = self.dir / "slurm.conf"
        self.conf.write_text(self._config(socket_path, self.cpus, memory))
        (self.dir / "plugstack.conf").write_text("")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)
        # -c: no state from any earlier run (there is none in a new folder; this keeps it that way)
        self._spawn("slurmctld", ["slurmctld", "-D", "-c"])
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node])
        while True:
            self._check_alive(deadline, f"node {self.node} did not become idle")
            state = self._query(["sinfo", "--noheader", "--nodes", self.node, "--format=%T"])
            if state is not None and state.strip() == "idle":  # "idle*": not responding yet
                return
            time.sleep(0.1)

    def _hardware(self) -> tuple[int, int]:
        """CPUs and memory (MiB) as slurmd itself counts them, so that the node is not drained as smaller."""
        out = self._setup_run(["slurmd", "-C"], "slurmd -C")
        found = dict(re.findall(r"(\w+)=(\S+)", out))
        try:
            return int(found["CPUs"]), int(found["RealMemory"])
        except (KeyError, ValueError):
            raise SlurmUnavailable(f"slurmd -C did not print CPUs and RealMemory: {out.strip()!r}") from None

    def _config(self, munge_socket: Path, cpus: int, memory: int) -> str:
        d = self.dir
        ctld_port = free_port()
        slurmd_port = free_port()
        while slurmd_port == ctld_port:  # free_port closes its socket, so the same free port can come twice
            slurmd_port = free_port()
        return f"""# written by evalpipe.devtools.slurmcluster for one throwaway single-node cluster
ClusterName=evalpipe
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire={CRED_EXPIRE}
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
TmpFS={d / "tmp"}
PlugStackConfig={d / "plugstack.conf"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd.log"}
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups: processes are tracked by parent id, tasks are not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
# CPUs are the consumable resource, so that one-CPU array tasks run side by side; pending tasks are looked
# at every second (not every 60); a cancelled task gets SIGKILL 2 s after SIGTERM (not 30); ended jobs stay
# visible to scontrol for 10 minutes; the node is idle as soon as slurmd registers
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
KillWait=2
MinJobAge=600
ReturnToService=2
NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""

    def _setup_run(self, args: list[str], what: str) -> str:
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmUnavailable(f"{what} failed: {e}") from None
        if done.returncode:
            raise SlurmUnavailable(f"{what} exited with {done.returncode}: {done.stderr.strip()[-800:]}")
        return done.stdout

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.dir / f"{name}.out"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                args,
                env=self.env or None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches this process, which stops them in order
                preexec_fn=die_with_parent(),
            )
        self._daemons[name] = (process, log)

    def _check_alive(self, deadline: float, waiting_for: str) -> None:
        for name, (process, log) in self._daemons.items():
            if process.poll() is not None:
                raise SlurmUnavailable(f"{name} exited with {process.returncode}\n{self._logs(name, log)}")
        if time.monotonic() > deadline:
            logs = "\n".join(self._logs(name, log) for name, (_, log) in self._daemons.items())
            raise SlurmUnavailable(f"{waiting_for} within {self.start_timeout:.0f} s\n{logs}")

    def _logs(self, name: str, out: Path) -> str:
        log = self.dir / f"{name}.log"
        return "\n".join(_tail(p) for p in (out, log) if p.exists()) or f"({name} wrote nothing)"

    def close(self) -> None:
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL), end what is left, remove the folder."""
        try:
            if "slurmctld" in self._daemons and self._daemons["slurmctld"][0].poll() is None:
                self._query(["scancel", "--partition", self.partition])
                deadline = time.monotonic() + 10
                while self._query(["squeue", "--noheader", "--format=%i"]) and time.monotonic() < deadline:
                    time.sleep(0.1)
            for process, _ in reversed(self._daemons.values()):
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(timeout=10)
            self._daemons.clear()
            if self._subreaper is not None:
                self._end_strays()
                _prctl(PR_SET_CHILD_SUBREAPER, self._subreaper)
                self._subreaper = None
        finally:
            if self.dir != Path():
                shutil.rmtree(self.dir, ignore_errors=True)

    def _end_strays(self) -> None:
        """Kill and reap what outlives the daemons (bounded: 5 s): each job's slurmstepd, which slurmd starts
        detached so that jobs survive a restart of slurmd, slurmctld's slurmscriptd, and the jobs' processes.
        This process adopted the first two (as their subreaper); the jobs, and anything else started with
        this cluster's environment, carry its SLURM_CONF, which is how they are found."""
        deadline = time.monotonic() + 5
        while True:
            adopted = [pid for pid, name in _children().items() if name in ("slurmstepd", "slurmscriptd")]
            marked = _using(self.conf) if self.conf != Path() else []
            if not adopted and not marked or time.monotonic() > deadline:
                return
            for pid in {*adopted, *marked} - {os.getpid()}:
                try:
                    os.kill(pid, signal.SIGKILL)  # a no-op on a zombie
                    os.waitpid(pid, os.WNOHANG)
                except (ProcessLookupError, ChildProcessError):
                    pass
            time.sleep(0.05)

    # ---- the client commands, with this cluster's SLURM_CONF

    def run(self, args: list[str], timeout: float = 15.0) -> str:
        """Run a Slurm command on this cluster; its standard output, or SlurmError with its standard error."""
        try:
            done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(args)}: no answer within {timeout:.0f} s") from None
        if done.returncode:
            raise SlurmError(f"{' '.join(args)} exited with {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def _query(self, args: list[str]) -> str | None:
        """A command whose failure is an answer too (None), while the cluster starts or stops."""
        try:
            return self.run(args, timeout=5)
        except SlurmError:
            return None

    def submit(self, script: Path, *sbatch_args: str, cwd: Path | None = None, script_args: tuple = ()) -> str:
        """sbatch the script (for example with "--array=0-3"), passing it `script_args`; the job id."""
        args = ["sbatch", "--parsable", *sbatch_args, str(script), *script_args]
        if cwd is not None:
            args.insert(2, f"--chdir={cwd}")
        return self.run(args).strip().split(";", 1)[0]

    def tasks(self, job_id: str) -> dict[int, Task]:
        """Each array task of a job by index (a job that is no array is index 0), from scontrol."""
        found: dict[int, Task] = {}
        for line in self.run(["scontrol", "--oneliner", "show", "job", job_id]).splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            if "JobId" not in fields:
                continue
            task = Task(fields["JobId"], fields["JobState"], fields["ExitCode"], int(fields.get("Restarts", 0)))
            for index in _indices(fields.get("ArrayTaskId", "0")):
                found[index] = task
        return found

    def wait(
        self, job_id: str, timeout: float, until: Callable[[Task], bool] | None = None, index: int | None = None
    ) -> dict[int, Task]:
        """Poll until every task of the job (or the one index) satisfies `until` (by default: has ended);
        all the job's tasks then."""
        deadline = time.monotonic() + timeout
        while True:
            tasks = self.tasks(job_id)
            watched = [tasks.get(index)] if index is not None else list(tasks.values())
            if watched and all(task is not None and (task.ended if until is None else until(task)) for task in watched):
                return tasks
            if time.monotonic() > deadline:
                states = {i: t.state for i, t in sorted(tasks.items())}
                raise SlurmError(f"job {job_id} not done within {timeout:.0f} s: {states}")
            time.sleep(0.1)

    def cancel(self, job_id: str, index: int) -> None:
        """Cancel one array task (scancel JOB_INDEX): its processes get SIGTERM, then SIGKILL after KillWait."""
        self.run(["scancel", f"{job_id}_{index}"])

    def requeue(self, job_id: str, index: int) -> None:
        """Put one array task back to pending (scontrol requeue); it may start CRED_EXPIRE + 1 s later."""
        self.run(["scontrol", "requeue", f"{job_id}_{index}"])


def _check() -> int:
    started = time.monotonic()
    try:
        with SlurmCluster() as cluster:
            up = time.monotonic() - started
            folder = Path(tempfile.mkdtemp(prefix="evalpipe-slurmcheck-"))
            try:
                script = folder / "task.sh"
                script.write_text('#!/bin/sh\necho "$SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT"\n')
                job = cluster.submit(script, "--array=0-1", f"--output={folder}/%a.out", cwd=folder)
                tasks = cluster.wait(job, timeout=30)
                outputs = {i: (folder / f"{i}.out").read_text().strip() for i in sorted(tasks)}
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    except SlurmUnavailable as e:
        print(f"slurm: the cluster cannot start here, so the Slurm test will be skipped: {e}", file=sys.stderr)
        return 1
    ok = sorted(tasks) == [0, 1] and all(t.state == "COMPLETED" for t in tasks.values())
    ok = ok and outputs == {0: "0 2", 1: "1 2"}
    print(f"slurm: cluster up in {up:.1f} s; job {job}: {[(i, t.state) for i, t in sorted(tasks.items())]}")
    print(f"slurm: task outputs {outputs}; everything stopped after {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


def _serve() -> int:
    sigterm_as_interrupt()  # stop the cluster on kill as on Ctrl-C
    with SlurmCluster() as cluster:
        print(f"export SLURM_CONF={cluster.conf}\n(Ctrl-C stops the cluster and removes {cluster.dir})", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["check", "serve"])
    args = parser.parse_args(argv)
    return _check() if args.command == "check" else _serve()


if __name__ == "__main__":
    sys.exit(main())
