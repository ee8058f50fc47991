"""Test-session environment: offline, no W&B, caches in a temporary folder shared by the
session (the tiny preset is built once per session).

The suite runs on two pytest-xdist workers (``-n 2 --dist loadfile`` in pyproject.toml: a file's
tests stay on one worker, so its module fixtures run once). Each worker has its own cache, but
the two builds that are deterministic and guarded by a file lock, the tiny presets
(``models/``) and the SFT warm start (``sft-warmstart/``), sit in a folder both workers link to,
so they are built once per test run; the other caches (reference log-probs, rejection-sampling
generations) stay per worker, as the tests that check a cache miss then a hit expect."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

_SESSION_CACHE = tempfile.mkdtemp(prefix="rlhf-lab-test-cache-")


def _share_between_workers(cache: str) -> None:
    """Link the lock-guarded builds of ``cache`` to one folder per xdist test run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return
    shared = os.path.join(tempfile.gettempdir(), f"rlhf-lab-test-shared-{run}")
    for name in ("models", "sft-warmstart"):
        os.makedirs(os.path.join(shared, name), exist_ok=True)
        os.symlink(os.path.join(shared, name), os.path.join(cache, name))


if "RLHF_LAB_CACHE" not in os.environ:
    _share_between_workers(_SESSION_CACHE)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "disabled"
os.environ.pop("WANDB_PROJECT", None)
os.environ.setdefault("RLHF_LAB_CACHE", _SESSION_CACHE)
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(_SESSION_CACHE, "datasets"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# plan and launch --shrink probe the base model before runs that learn from their own samples
# (rlhf_lab/planning/calibration.py): off in the suite, whose plans and launches predate it;
# the calibration tests pass their own probe (tests/lab/test_calibration.py)
os.environ.setdefault("RLHF_LAB_CALIBRATE", "0")
# Plans read throughput calibrations from the cache only: no test pays for a measurement it did
# not ask for (tests/lab/test_time_predictor.py sets the mode it checks).
os.environ.setdefault("RLHF_LAB_THROUGHPUT", "cached")

# One math thread per process: the lab tests run trainer subprocesses beside pytest on 2 cores,
# and oversubscribed OpenMP threads slow a tiny model's step by an order of magnitude.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


import pytest  # noqa: E402  (after the environment above is set)


@pytest.fixture
def record_forward_shapes():
    """``record(module) -> list``: from then on (until the test ends), the ``input_ids`` shape
    of every call of ``module`` is appended to the returned list, by a forward pre-hook (the
    call itself runs unchanged)."""
    hooks = []

    def record(module) -> list[tuple[int, ...]]:
        shapes: list[tuple[int, ...]] = []

        def note_shape(_module, _args, kwargs) -> None:
            shapes.append(tuple(kwargs["input_ids"].shape))

        hooks.append(module.register_forward_pre_hook(note_shape, with_kwargs=True))
        return shapes

    yield record
    for hook in hooks:
        hook.remove()


# ---------------------------------------------------------------------------------------------
# Trainer runs: the setup the family end-to-end tests share
# ---------------------------------------------------------------------------------------------

RUN_DIR_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "progress.json", "summary.json")


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for the block, restored afterwards. The tiny model
    gains nothing from OpenMP workers, and on a shared 2-core machine spinning workers make every
    forward many times slower: the trainer tests run on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def trainer_argv(config, run_dir, overrides, resume: bool = False) -> list[str]:
    """A trainer's command line: ``--config``, ``--run-dir``, one ``--set`` per override and
    ``--resume`` when asked."""
    argv = ["--config", str(config), "--run-dir", str(run_dir)]
    for item in overrides:
        argv += ["--set", item]
    if resume:
        argv.append("--resume")
    return argv


def assert_complete_run_dir(path, extra_files=(), check_rows: bool = True) -> dict:
    """Assert that ``path`` is a finished, succeeded run folder (the files every trainer
    writes plus ``extra_files``; progress at its last step; with ``check_rows`` every metrics
    row has step, time_s and phase) and return its summary."""
    from trainers.core.rundir import read_jsonl

    for name in (*RUN_DIR_FILES, *extra_files):
        assert (path / name).is_file(), f"{name} missing from {path}"
    summary = json.loads((path / "summary.json").read_text())
    assert summary["outcome"] == "succeeded", summary
    if check_rows:
        rows = read_jsonl(path / "metrics.jsonl")
        assert all({"step", "time_s", "phase"} <= set(r) for r in rows)
    progress = json.loads((path / "progress.json").read_text())
    assert progress["step"] == progress["total_steps"] == summary["steps"]
    return summary


def assert_same_gradients(got, want, *, rel: float = 1e-5) -> None:
    """Two gradient tensors (or sequences of them) are the same up to float32 reordering: the
    relative norm of the difference is at most ``rel``. An element-wise ``allclose`` is brittle
    here (a sum taken in another order on another CPU moves single elements by ~1e-5 relative),
    while any real difference (a mask, a position, a missing term) moves the norm by orders of
    magnitude more than ``rel``."""
    import torch

    got = [got] if isinstance(got, torch.Tensor) else list(got)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        scale = w.float().norm()
        err = (g.float() - w.float()).norm()
        assert scale > 0, "the reference gradient is zero: nothing was compared"
        assert err <= rel * scale, f"gradients differ: |got - want| / |want| = {err / scale:.3g}"


@pytest.fixture
def progress_writes(monkeypatch):
    """Every progress.json a trainer writes from now on, in order, as (phase, step, total)."""
    from trainers.core.rundir import RunDir

    seen: list[tuple[str | None, int, int | None]] = []
    original = RunDir.write_progress

    def spy(self, step, total_steps, *, phase=None, **extra):
        seen.append((phase, step, total_steps))
        return original(self, step, total_steps, phase=phase, **extra)

    monkeypatch.setattr(RunDir, "write_progress", spy)
    return seen


def assert_phases(writes, *expected: str) -> None:
    """The phases a run entered (from ``progress_writes``) start with ``loading_model`` and hold
    ``expected`` in this order (others may come between)."""
    entered = [
        phase for i, (phase, _, _) in enumerate(writes) if i == 0 or writes[i - 1][0] != phase
    ]
    assert entered[0] == "loading_model", entered
    it = iter(entered)
    missing = [p for p in expected if not any(p == q for q in it)]
    assert not missing, (missing, entered)


def pytest_collection_modifyitems(config, items):
    """Run the files that hold a ``slow`` test first (each file's own order kept): the two
    xdist workers take files in this order, so the long ones start early and the short ones fill
    in at the end, instead of one worker finishing alone on a long file."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture
def empty_hub_cache():
    """No hub model has any file in the local Hugging Face cache (the lab's one cache seam)."""
    from rlhf_lab.planning.memory import hub_cache_lookup

    with hub_cache_lookup(lambda hub_id, filename: None):
        yield


# ---------------------------------------------------------------------------------------------
# Trainer seams (issue 27 item 5): a real stop, not a patched flag
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def sigterm_at(monkeypatch):
    """``sigterm_at("step_end:2")``: a trainer run in this process sends itself a real SIGTERM
    the 2nd time it reaches the stop point ``step_end`` (the end of an optimizer step; any point
    of ``RLHF_LAB_SIGTERM_AT`` works, see ``trainers.core.rundir.sigterm_self_at``);
    ``sigterm_at(None)``: no more."""
    from trainers.core.rundir import SIGTERM_ENV

    def arm(point: str | None) -> None:
        if point is None:
            monkeypatch.delenv(SIGTERM_ENV, raising=False)
        else:
            monkeypatch.setenv(SIGTERM_ENV, point)

    return arm


# ---------------------------------------------------------------------------------------------
# Machine seams
# ---------------------------------------------------------------------------------------------


def fake_gpus(free_gb, total_gb: float = 48.0, name: str = "Fake GPU") -> list:
    """GPUs (``GpuInfo``, NVML order, UUIDs ``GPU-fake-<i>``) with ``free_gb[i]`` GiB free of
    ``total_gb`` each (of the free memory where that is more)."""
    from rlhf_lab.runs.resources import GpuInfo

    gpus = []
    for i, free in enumerate(free_gb):
        total = max(total_gb, free)
        gpus.append(
            GpuInfo(
                index=i,
                name=name,
                uuid=f"GPU-fake-{i}",
                total_gb=total,
                used_gb=total - free,
                free_gb=free,
            )
        )
    return gpus


def _gpu_query(gpus):
    """The Machine's GPU query for ``gpus``: a list of free GiB (:func:`fake_gpus`) or of
    ``GpuInfo``, fresh copies on every call (the report writes into what it gets)."""
    if callable(gpus):
        return gpus
    numbers = all(isinstance(g, int | float) for g in gpus)
    inventory = fake_gpus(gpus) if numbers else list(gpus)
    return lambda: ([g.model_copy(deep=True) for g in inventory], "fake", [])


def _as_fact(value):
    return value if callable(value) else (lambda: value)


@pytest.fixture
def machine():
    """``machine(gpus=..., cores=..., free_ram_gb=..., total_ram_gb=...)``: until the test ends,
    the whole lab (every thread) sees a machine with these facts (``rlhf_lab/runs/machine.py``,
    the one seam for what the machine has). ``gpus``: a list of free GiB per GPU (fake 48 GiB
    GPUs), of ``GpuInfo``, or a query function; the others a number or a function asked at each
    read. Facts not named keep their value (this machine's, until a call names them); a later
    call changes the machine again. Returns the machine set."""
    from dataclasses import replace

    from rlhf_lab.runs.machine import this_machine, using_machine

    names = {"gpus": "gpu_query", "cores": "cpu_cores"}
    with contextlib.ExitStack() as stack:

        def set_machine(**facts):
            changes = {
                names.get(k, k): _gpu_query(v) if k == "gpus" else _as_fact(v)
                for k, v in facts.items()
            }
            return stack.enter_context(using_machine(replace(this_machine(), **changes)))

        yield set_machine


@pytest.fixture
def cpu_box(machine):
    """A machine with no GPU and 20 GiB of its 32 GiB of RAM free: what the pretrained-model
    shrink tests pin, whatever machine runs them."""
    return machine(gpus=[], free_ram_gb=20.0, total_ram_gb=32.0)


@pytest.fixture
def offline_lab(tmp_path, monkeypatch):
    """A lab rooted in ``tmp_path``, offline, whose Hugging Face caches (datasets, hub) are
    empty folders there: no test reads this machine's caches. Returns the root."""
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return tmp_path


def live_run_on(run_dir, device: str):
    """A lab run that trains on ``device`` now, so the device is busy: a live process (the
    caller kills it) behind ``run_dir``'s run.json in state running, as the launcher records
    one (pid, process group, create time)."""
    import subprocess
    import sys

    import psutil

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "id": run_dir.name,
        "family": "direct_alignment",
        "algorithm": "dpo",
        "campaign": run_dir.parent.parent.name,
        "device": device,
        "state": "running",
        "created_at": "2026-03-01T11:00:00.000+00:00",
        "pid": holder.pid,
        "pgid": holder.pid,
        "create_time": psutil.Process(holder.pid).create_time(),
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return holder


# A pretrained model the lab reads without loading it: a folder holding SmolLM2-135M-Instruct's
# config.json (a Llama of 134.5M parameters), which is all the shrink and the estimates read.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}


def model_folder(root, name: str, **changes) -> str:
    """A SmolLM2-135M-Instruct stand-in folder ``root/name`` (its config.json, ``changes``
    applied)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**SMOLLM2_CONFIG, **changes}))
    return str(folder)


@pytest.fixture
def smol(tmp_path) -> str:
    """The SmolLM2-135M-Instruct stand-in (:func:`model_folder`) as a model name."""
    return model_folder(tmp_path, "smol-135m")


# Lab supervisor seams
#
# The runs layer builds the trainer's command line, starts runs, the queue worker and a run's
# recorder, checks processes for life and reads its clock through one seam object,
# rlhf_lab.runs.supervisor.Supervisor. These fixtures set its fields for one test.


@pytest.fixture
def supervise():
    """``supervise(field=value, ...)`` runs the rest of the test under the run supervisor with
    those fields replaced (see :class:`rlhf_lab.runs.supervisor.Supervisor`); a later call wins;
    everything is undone when the test ends."""
    from rlhf_lab.runs.supervisor import supervised_by

    with contextlib.ExitStack() as blocks:
        yield lambda **changes: blocks.enter_context(supervised_by(**changes))


@pytest.fixture
def no_queue_worker(supervise):
    """No detached queue worker is started: queued runs stay queued."""
    supervise(ensure_queue_worker=lambda: None)


@pytest.fixture
def no_recorder(supervise):
    """A run started at once gets no detached recorder process (its ledger row is not refreshed
    when it ends)."""
    supervise(record_when_ended=lambda run_id: 0)


def stand_in_argv(code: str, *extra: str):
    """A trainer command line builder that starts ``python -c CODE RUN_DIR EXTRA...`` (plus
    ``--resume`` / ``--nproc N`` when the lab asks for them) instead of the family's trainer:
    a real detached process that knows its run folder (``sys.argv[1]``)."""
    import sys

    def argv(family, run_dir, resume=False, nproc=None):  # noqa: ARG001
        tail = [*(["--resume"] if resume else []), *(["--nproc", str(nproc)] if nproc else [])]
        return [sys.executable, "-c", code, str(run_dir), *extra, *tail]

    return argv


@pytest.fixture
def stand_in_trainer(supervise):
    """``stand_in_trainer(code, *extra)``: the runs this test starts run ``code`` as their
    trainer (:func:`stand_in_argv`); a later call changes it for the runs started after."""

    def use(code: str, *extra: str) -> None:
        supervise(trainer_argv=stand_in_argv(code, *extra))

    return use


_OPENED: list[list[str]] = []  # the lists of the run_json_reads fixtures in force
_READ: list[list[str]] = []  # the lists of the files_read fixtures in force
_HOOKED: list[bool] = []  # the audit hook is installed (it cannot be removed)


def _note_reads(event: str, args: tuple) -> None:
    """Audit hook: a file opened for reading, noted by every ``files_read`` fixture in force
    (its path) and, for a run.json opened by a ``str`` path (as the lab's run-file readers do),
    by the innermost ``run_json_reads`` one (its run folder's name)."""
    if event != "open" or not (_OPENED or _READ) or not isinstance(args[0], (str, os.PathLike)):
        return
    path, mode, flags = os.fspath(args[0]), args[1], args[2]
    if not isinstance(path, str):  # a bytes path
        return
    if mode is None:  # os.open
        reading = flags & os.O_ACCMODE == os.O_RDONLY
    else:
        reading = mode.startswith("r") and "+" not in mode
    if not reading:
        return
    for seen in _READ:
        seen.append(path)
    if _OPENED and isinstance(args[0], str) and path.endswith(f"{os.sep}run.json"):
        _OPENED[-1].append(os.path.basename(os.path.dirname(path)))


def _hook_reads() -> None:
    import sys

    if not _HOOKED:
        sys.addaudithook(_note_reads)
        _HOOKED.append(True)


@contextlib.contextmanager
def _reads_noted_in(in_force: list[list[str]]):
    """A new list that the audit hook fills while the block runs (``in_force`` is _OPENED or
    _READ: which reads it notes)."""
    _hook_reads()
    seen: list[str] = []
    in_force.append(seen)
    try:
        yield seen
    finally:
        in_force.remove(seen)


@pytest.fixture
def run_json_reads():
    """The names of the run folders whose run.json this process opened for reading during the
    test (in order, repeats kept): what the lab really read, seen by an audit hook (installed
    once; it records only while such a fixture is in force)."""
    with _reads_noted_in(_OPENED) as seen:
        yield seen


@pytest.fixture
def files_read():
    """The paths of the files this process opened for reading during the test (in order,
    repeats kept), seen by the same audit hook as :func:`run_json_reads`."""
    with _reads_noted_in(_READ) as seen:
        yield seen
