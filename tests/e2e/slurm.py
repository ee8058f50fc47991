"""A real one-node Slurm cluster on this machine, for the lab's Slurm tests (tests/lab/test_slurm*.py).

    python tests/e2e/slurm.py          # install (Debian slurm-wlm + munge), configure, start

Idempotent: a cluster already answering is left as it is. What it does, as root:

1. ``apt-get install -y slurmctld slurmd munge slurm-client`` when ``sbatch`` is missing;
2. a munge key (``mungekey``) when there is none, and ``munged`` started when ``munge -n``
   fails;
3. ``/etc/slurm/slurm.conf`` for one node ``localhost`` with this machine's CPUs and memory
   (``slurmd -C``; the node declares at least 8 CPUs, ``SlurmdParameters=config_overrides``, so
   a few tiny jobs run side by side on a 2-core machine), partition ``debug``, no accounting;
   a conf this script did not write is never replaced;
4. ``slurmctld -D`` and ``slurmd -D -N localhost`` started detached (logs in /var/log/slurm/),
   then it waits until the node is idle.

``ensure_slurm()`` returns None when the cluster works, else why it does not (not root, no
apt-get, a failed step). ``.ci/run`` calls this script and sets ``RLHF_LAB_REQUIRE_SLURM=1``, so
in CI the Slurm tests fail instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")
MARK = "# written by rlhf-lab tests/e2e/slurm.py"
LOG_DIR = Path("/var/log/slurm")
MIN_CPUS = 8


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _ok(cmd: list[str], timeout: float = 15) -> bool:
    try:
        return _run(cmd, timeout=timeout).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _node_line() -> str:
    """``NodeName=localhost CPUs=.. RealMemory=..`` from what slurmd detects here."""
    out = _run(["slurmd", "-C"]).stdout.split("\n")[0]
    fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
    cpus = max(int(fields.get("CPUs", "1")), MIN_CPUS)
    memory = int(fields.get("RealMemory", "1024"))
    return (
        f"NodeName=localhost NodeHostname=localhost CPUs={cpus} RealMemory={memory} State=UNKNOWN"
    )


def _conf_text() -> str:
    return "\n".join(
        [
            MARK,
            "ClusterName=rlhflab",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "StateSaveLocation=/var/spool/slurmctld",
            "SlurmdSpoolDir=/var/spool/slurmd",
            "SlurmctldPidFile=/run/slurmctld.pid",
            "SlurmdPidFile=/run/slurmd.pid",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=600",
            "KillWait=10",
            "Waittime=0",
            # a client waits this long for a busy controller (10 s by default): two cores
            # shared with the suite and three torch jobs starved slurmctld past 10 s in CI
            "MessageTimeout=20",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            f"SlurmctldLogFile={LOG_DIR}/slurmctld.log",
            f"SlurmdLogFile={LOG_DIR}/slurmd.log",
            _node_line(),
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _install() -> str | None:
    if shutil.which("sbatch") and shutil.which("slurmctld") and shutil.which("munged"):
        return None
    if not shutil.which("apt-get"):
        return "sbatch is missing and there is no apt-get to install slurm-wlm"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    packages = ["slurmctld", "slurmd", "munge", "slurm-client"]
    result = _run(["apt-get", "install", "-y", *packages], timeout=600, env=env)
    if result.returncode != 0:
        _run(["apt-get", "update"], timeout=600, env=env)
        result = _run(["apt-get", "install", "-y", *packages], timeout=600, env=env)
    if result.returncode != 0:
        return f"apt-get install {' '.join(packages)} failed: {result.stderr[-500:]}"
    return None


def _munge() -> str | None:
    key = Path("/etc/munge/munge.key")
    if not key.is_file():
        _run(["mungekey", "--create", "--force"])
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    if _ok(["munge", "-n"]):
        return None
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
    for _ in range(50):
        if _ok(["munge", "-n"]):
            return None
        time.sleep(0.1)
    return "munged did not start (munge -n fails)"


def _configure() -> str | None:
    if CONF.is_file() and MARK not in CONF.read_text():
        return None  # somebody else's cluster: used as it is
    text = _conf_text()
    if not CONF.is_file() or CONF.read_text() != text:
        CONF.parent.mkdir(parents=True, exist_ok=True)
        CONF.write_text(text)
    for folder in ("/var/spool/slurmctld", "/var/spool/slurmd", str(LOG_DIR)):
        Path(folder).mkdir(parents=True, exist_ok=True)
    return None


def _start_daemon(argv: list[str], name: str) -> None:
    with (LOG_DIR / f"{name}.out").open("ab") as log:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def _node_state() -> str:
    try:
        return _run(["sinfo", "-h", "-N", "-o", "%T"], timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _daemons() -> str | None:
    if not _ok(["scontrol", "ping"]) or "UP" not in _run(["scontrol", "ping"]).stdout:
        _start_daemon(["slurmctld", "-D"], "slurmctld")
        for _ in range(100):
            if "UP" in _run(["scontrol", "ping"], timeout=10).stdout:
                break
            time.sleep(0.2)
        else:
            return f"slurmctld did not come up (see {LOG_DIR}/slurmctld.log)"
    state = _node_state()
    if not state or "down" in state or "unk" in state:
        if not _ok(["pgrep", "-x", "slurmd"]):
            _start_daemon(["slurmd", "-D", "-N", "localhost"], "slurmd")
    deadline = time.time() + 60
    while time.time() < deadline:
        state = _node_state()
        if state.startswith(("idle", "mix", "alloc")):
            return None
        if "drain" in state or state.startswith("down"):
            _run(["scontrol", "update", "NodeName=localhost", "State=RESUME"], timeout=10)
        time.sleep(0.5)
    return f"the Slurm node did not become idle (state {state!r}; see {LOG_DIR}/slurmd.log)"


def ensure_slurm() -> str | None:
    """None when a one-node Slurm answers here (installed and started if need be), else why not."""
    if (
        shutil.which("sbatch")
        and _ok(["sbatch", "--version"])
        and _node_state().startswith(("idle", "mix", "alloc"))
    ):
        return None
    if os.geteuid() != 0:
        return "setting up Slurm needs root (apt-get, munged, slurmctld, slurmd)"
    for step in (_install, _munge, _configure, _daemons):
        try:
            why = step()
        except (OSError, subprocess.SubprocessError) as err:
            why = f"{step.__name__.strip('_')}: {err}"
        if why:
            return why
    return None


if __name__ == "__main__":
    reason = ensure_slurm()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        sys.exit(1)
    print(_run(["sinfo"]).stdout, end="")
