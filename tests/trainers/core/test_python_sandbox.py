"""The Python sandbox with real subprocesses: ordinary programs work, and each refused or limited
case (import, file access, dunder escape, endless loop, huge allocation, huge output) comes back
as a one-line ToolError or a truncated output while the test process carries on."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

from trainers.core.environments.python_sandbox import (
    SandboxLimits,
    ToolError,
    checked_code,
    python_tool,
    run_in_child,
    truncated,
)

FAST_WALL = SandboxLimits(cpu_seconds=30, wall_seconds=0.5)


def _error(body: str, limits: SandboxLimits = SandboxLimits()) -> str:
    with pytest.raises(ToolError) as raised:
        python_tool(body, limits)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_arithmetic_works():
    assert python_tool("sum(range(10))") == "45"


def test_statements_print_and_a_final_expression_make_the_output():
    body = """
        total = 0
        for _ in range(3):
            total += 2
        print("total", total)
        sqrt(16) + math.floor(2.5)
    """
    assert python_tool(body) == "total 6\n6.0"


def test_a_final_none_or_a_final_statement_adds_nothing():
    assert python_tool("x = [3, 1, 2]\nx.sort()") == ""
    assert python_tool("print('hi')") == "hi\n"


def test_an_exception_is_its_type_and_message_on_one_line():
    assert _error("1/0") == "ZeroDivisionError: division by zero"
    assert _error("undefined_name + 1") == "NameError: name 'undefined_name' is not defined"
    assert _error("x = (\n").startswith("SyntaxError:")


@pytest.mark.parametrize("body", ["import os", "from os import path", "import math as m"])
def test_imports_are_refused(body):
    assert _error(body).startswith("refused: import is not allowed")


def test_dunder_import_is_refused():
    assert _error("__import__('os').system('echo hi')") == (
        "refused: the name __import__ is not allowed"
    )


@pytest.mark.parametrize(
    "body",
    [
        "().__class__.__bases__[0].__subclasses__()",
        "(lambda: 0).__globals__",
        "'{0.__class__}'.format(1)",
        "(x for x in []).gi_frame.f_globals",
    ],
)
def test_dunder_and_frame_escapes_are_refused(body):
    assert _error(body).startswith("refused: the attribute .")


@pytest.mark.parametrize(
    "body",
    [
        "open('out.txt', 'w').write('x')",
        "exec('1')",
        "eval('1')",
        "getattr(1, 'real')",
        "globals()",
        "type(1)",
    ],
)
def test_file_access_and_reflective_builtins_are_refused(body):
    assert "is not allowed" in _error(body)


def test_builtins_outside_the_whitelist_do_not_exist_in_the_child():
    assert _error("iter([1])") == "NameError: name 'iter' is not defined"


def test_an_endless_loop_is_stopped_and_the_parent_returns_quickly():
    start = time.monotonic()
    message = _error("while True:\n    pass")
    assert time.monotonic() - start < 5.0
    assert message.startswith("TimeoutError:")
    assert python_tool("1 + 1") == "2"  # this process is alive and the tool still works


def test_the_wall_clock_limit_kills_the_child():
    start = time.monotonic()
    assert _error("while True: pass", FAST_WALL) == (
        "TimeoutError: the program ran past 0.5 s and was stopped"
    )
    assert time.monotonic() - start < 3.0


def test_the_cpu_limit_stops_a_busy_child():
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=20)
    assert _error("while True: pass", limits) == (
        "TimeoutError: the program used more than 1 s of CPU time"
    )


@pytest.mark.parametrize("body", ["'x' * 10**10", "[0] * 10**9"])
def test_a_huge_allocation_is_a_memory_error(body):
    assert _error(body) == "MemoryError: over the 256 MB memory limit"


def test_a_huge_output_is_truncated_with_a_marker():
    output = python_tool("'a' * 10**6")
    assert output.startswith("'aaaa")
    assert output.endswith("... [output truncated: 999602 more characters]")
    assert len(output) < 500
    printed = python_tool("for _ in range(1000): print('b' * 1000)")
    assert (
        printed.startswith("b" * 400) and "[output truncated: 1000600 more characters]" in printed
    )


def test_code_over_the_length_limit_is_refused_before_running():
    assert _error("1 +" * 1000 + " 1") == "program longer than 2000 characters"
    assert _error("   \n ") == "empty program"


def test_checked_code_dedents_and_keeps_a_clean_program():
    assert checked_code("\n    x = 1\n    x + 1\n", SandboxLimits()) == "x = 1\nx + 1"


def test_truncated_counts_what_was_cut():
    assert truncated("abc", 0, 5) == "abc"
    assert truncated("abcdef", 0, 4) == "abcd... [output truncated: 2 more characters]"
    assert truncated("abcd", 10, 4) == "abcd... [output truncated: 10 more characters]"


ESCAPE_TO_OS = """
for cls in ().__class__.__base__.__subclasses__():
    if cls.__name__ == "_wrap_close":
        os_globals = cls.__init__.__globals__
"""


def test_the_child_limits_hold_even_for_code_that_escaped_the_first_wall(tmp_path):
    # run_in_child skips the syntax-tree check: this code reaches the os module, as an escape
    # would, and still cannot write a byte to a file (RLIMIT_FSIZE 0: the write fails with EFBIG,
    # Python ignoring SIGXFSZ).
    target = tmp_path / "written.txt"
    code = ESCAPE_TO_OS + (
        f"fd = os_globals['open']({str(target)!r}, os_globals['O_WRONLY'] | os_globals['O_CREAT'])\n"
        "os_globals['write'](fd, b'escaped')"
    )
    completed = run_in_child(code, SandboxLimits())
    assert completed is not None
    assert json.loads(completed.stdout) == {
        "ok": False,
        "error": "OSError: [Errno 27] File too large",
    }
    assert target.read_bytes() == b""


def test_the_child_has_an_empty_environment_and_a_fresh_directory():
    # Python itself may set LC_CTYPE in the child (PEP 538 locale coercion): nothing else is there.
    code = ESCAPE_TO_OS + "print(sorted(os_globals['environ']))\nprint(os_globals['getcwd']())"
    completed = run_in_child(code, SandboxLimits())
    assert completed is not None and completed.returncode == 0
    names, cwd = json.loads(completed.stdout)["output"].splitlines()
    assert set(ast.literal_eval(names)) <= {"LC_CTYPE"}
    assert Path(cwd).name.startswith("rlhf-lab-sandbox-") and not Path(cwd).exists()


def test_limits_must_be_positive_and_cpu_seconds_round_up():
    with pytest.raises(ValueError, match="positive: wall_seconds, memory_mb"):
        SandboxLimits(wall_seconds=0, memory_mb=-1)
    assert SandboxLimits(cpu_seconds=0.2).whole_cpu_seconds == 1
    assert SandboxLimits(cpu_seconds=2.5).whole_cpu_seconds == 3
