"""The Python tool: a short Python program run out of process, so a hostile one can neither hang
nor crash the trainer.

Input: one or more statements (at most ``max_code_chars``); when the last one is an expression,
its ``repr`` is the output (unless it is None), after anything the program printed. Only a
whitelist of builtins exists (abs, min, max, sum, len, range, round, pow, divmod, int, float,
str, list, tuple, dict, set, sorted, reversed, enumerate, zip, map, filter, all, any, bool,
print, repr, isinstance, chr, ord, hex, bin, oct and a few exception types), plus the ``math``
module and its functions by their own names (``sqrt(2)`` and ``math.sqrt(2)``).

Two walls:

1. In this process, before anything runs, the code's syntax tree is checked: no ``import``, no
   name that starts with ``__`` (``__import__``, ``__builtins__``), no attribute that starts with
   ``_`` (``__class__``, ``__subclasses__``, ``__globals__``...), no frame or code attributes, no ``format``/``format_map`` (they reach
   attributes through a string), and none of the names in :data:`FORBIDDEN_NAMES`.
2. The code runs in a fresh ``sys.executable -I -S`` process (``sandbox_child.py``) with an empty
   environment, in a temporary directory, in its own process group, under resource limits that
   the child sets on itself before it reads the code: CPU seconds, address space, no file
   writes (RLIMIT_FSIZE 0), no new processes (RLIMIT_NPROC 0 where allowed), 8 open files, no
   core dump. The limits are set by the child rather than by ``preexec_fn`` because
   ``preexec_fn`` is not safe in a process with threads (the trainer's torch threads), the
   ``subprocess`` documentation warns. A wall-clock timeout kills the whole process group.

The output is cut at ``max_output_chars`` with a visible marker. Every failure (refused code,
syntax error, exception, timeout, memory) is a :class:`ToolError` with a one-line message.
"""

from __future__ import annotations

import ast
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from trainers.core.environments.errors import ToolError

__all__ = ["FORBIDDEN_NAMES", "SandboxLimits", "ToolError", "python_tool"]

CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
FORBIDDEN_NAMES = frozenset(
    "open exec eval compile input globals locals vars getattr setattr delattr breakpoint help "
    "exit quit memoryview type object super classmethod staticmethod property".split()
)
FORBIDDEN_ATTRIBUTES = frozenset(
    "format format_map mro gi_frame gi_code gi_yieldfrom cr_frame cr_code ag_frame ag_code "
    "f_globals f_locals f_builtins f_back f_code tb_frame tb_next func_globals".split()
)
_CPU_SIGNALS = {signal.SIGXCPU, signal.SIGKILL}


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run: CPU seconds (rounded up to whole seconds), wall-clock seconds, address
    space in MB, output and code length in characters; each must be positive."""

    cpu_seconds: float = 1.0
    wall_seconds: float = 3.0
    memory_mb: int = 256
    max_output_chars: int = 400
    max_code_chars: int = 2000

    def __post_init__(self) -> None:
        bad = [name for name, value in vars(self).items() if not value > 0]
        if bad:
            raise ValueError(f"sandbox limits must be positive: {', '.join(bad)}")

    @property
    def whole_cpu_seconds(self) -> int:
        """The CPU limit the child gets: RLIMIT_CPU counts whole seconds, so it is rounded up."""
        return max(1, math.ceil(self.cpu_seconds))


def python_tool(body: str, limits: SandboxLimits = SandboxLimits()) -> str:
    """The output of the program in ``body`` run in the sandbox; :class:`ToolError` on failure."""
    code = checked_code(body, limits)
    completed = run_in_child(code, limits)
    return _read_result(completed, limits)


def checked_code(body: str, limits: SandboxLimits) -> str:
    """``body`` dedented and trimmed, once it parses and passes the refusals of the first wall."""
    code = textwrap.dedent(body).strip()
    if not code:
        raise ToolError("empty program")
    if len(code) > limits.max_code_chars:
        raise ToolError(f"program longer than {limits.max_code_chars} characters")
    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as error:
        raise ToolError(f"SyntaxError: {error.msg} (line {error.lineno})") from None
    for node in ast.walk(tree):
        refusal = _refusal(node)
        if refusal:
            raise ToolError(f"refused: {refusal}")
    return code


def _refusal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return "import is not allowed (math is already there)"
    if isinstance(node, ast.Name) and (node.id.startswith("__") or node.id in FORBIDDEN_NAMES):
        return f"the name {node.id} is not allowed"
    if isinstance(node, ast.Attribute) and (
        node.attr.startswith("_") or node.attr in FORBIDDEN_ATTRIBUTES
    ):
        return f"the attribute .{node.attr} is not allowed"
    return None


def run_in_child(code: str, limits: SandboxLimits) -> subprocess.CompletedProcess[str] | None:
    """The finished child, or None when it ran past the wall-clock limit (then it is killed).

    This is the second wall alone: ``code`` is not checked here (:func:`python_tool` checks it).
    """
    argv = [
        sys.executable,
        "-I",
        "-S",
        "-X",
        "utf8",
        str(CHILD_SCRIPT),
        str(limits.whole_cpu_seconds),
        str(limits.memory_mb),
        str(limits.max_output_chars),
    ]
    with tempfile.TemporaryDirectory(prefix="rlhf-lab-sandbox-") as cwd:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env={},
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(code, timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.communicate()
            return None
        finally:
            if process.poll() is None:
                _kill_group(process)
                process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_result(completed: subprocess.CompletedProcess[str] | None, limits: SandboxLimits) -> str:
    if completed is None:
        raise ToolError(
            f"TimeoutError: the program ran past {limits.wall_seconds:g} s and was stopped"
        )
    if completed.returncode < 0:
        number = -completed.returncode
        if number in _CPU_SIGNALS:
            raise ToolError(
                f"TimeoutError: the program used more than {limits.whole_cpu_seconds} s of CPU time"
            )
        raise ToolError(f"the program crashed (signal {signal.Signals(number).name})")
    try:
        result = json.loads(completed.stdout)
    except json.JSONDecodeError:
        raise ToolError(_crash_message(completed.stderr, limits)) from None
    if not result.get("ok"):
        raise ToolError(str(result.get("error", "the program failed")))
    return truncated(str(result["output"]), int(result.get("dropped", 0)), limits.max_output_chars)


def _crash_message(stderr: str, limits: SandboxLimits) -> str:
    if "MemoryError" in stderr:
        return f"MemoryError: over the {limits.memory_mb} MB memory limit"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"the program failed: {lines[-1][:200]}" if lines else "the program failed"


def truncated(output: str, dropped: int, limit: int) -> str:
    """``output`` cut to ``limit`` characters, with a marker saying how many were left out."""
    dropped += max(len(output) - limit, 0)
    if not dropped:
        return output
    return f"{output[:limit]}... [output truncated: {dropped} more characters]"
