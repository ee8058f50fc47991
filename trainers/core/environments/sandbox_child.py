"""The child side of the Python sandbox: run as a script (``python -I -S sandbox_child.py``), never
imported by the trainer. It sets its own resource limits before it reads any untrusted code, then
runs the code from stdin with a whitelist of builtins and the ``math`` functions, and writes one
JSON object to stdout: ``{"ok": true, "output": ..., "dropped": N}`` or ``{"ok": false,
"error": "Type: message"}``. The parent (``python_sandbox.py``) has already refused imports,
dunder access and the dangerous names; these limits are the second wall.

Argv: cpu seconds (int), memory MB, max output characters.
"""

import ast
import builtins
import json
import math
import resource
import sys

SAFE_BUILTINS = (
    "abs min max sum len range round pow divmod int float str list tuple dict set sorted reversed "
    "enumerate zip map filter all any bool print repr isinstance chr ord hex bin oct "
    "Exception ValueError TypeError ZeroDivisionError ArithmeticError IndexError KeyError"
).split()
MAX_ERROR_CHARS = 300


class BoundedWriter:
    """A stdout that keeps the first ``limit`` characters written and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def write(self, text: str) -> int:
        text = str(text)
        room = max(self.limit - self.kept, 0)
        if room:
            self.parts.append(text[:room])
        self.kept += min(len(text), room)
        self.dropped += max(len(text) - room, 0)
        return len(text)

    def flush(self) -> None:
        pass

    def value(self) -> str:
        return "".join(self.parts)


def set_limits(cpu_seconds: int, memory_mb: int) -> None:
    """CPU time, address space, no file writes, no new processes, few open files, no core dump."""
    wanted = [
        (resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1)),
        (resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20)),
        (resource.RLIMIT_FSIZE, (0, 0)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NOFILE, (8, 8)),
    ]
    if hasattr(resource, "RLIMIT_NPROC"):
        wanted.append((resource.RLIMIT_NPROC, (0, 0)))
    for kind, limits in wanted:
        try:
            resource.setrlimit(kind, limits)
        except (ValueError, OSError):
            pass  # not allowed here (e.g. RLIMIT_AS on macOS): the other limits still hold


def sandbox_globals() -> dict:
    safe = {name: getattr(builtins, name) for name in SAFE_BUILTINS}
    names = {name: getattr(math, name) for name in dir(math) if not name.startswith("_")}
    return {"__builtins__": safe, "math": math, **names}


def run(code: str, out: BoundedWriter) -> None:
    """Execute ``code``; the repr of a final expression statement (when not None) is output."""
    tree = ast.parse(code, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    env = sandbox_globals()
    exec(compile(tree, "<tool>", "exec"), env)
    if last is not None:
        value = eval(compile(last, "<tool>", "eval"), env)
        if value is not None:
            out.write(repr(value))


def one_line(error: BaseException) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text[:MAX_ERROR_CHARS]


def main() -> None:
    cpu_seconds, memory_mb, max_output = (int(a) for a in sys.argv[1:4])
    real_stdout = sys.stdout
    code = sys.stdin.read()
    set_limits(cpu_seconds, memory_mb)
    out = BoundedWriter(max_output)
    sys.stdout = out
    try:
        run(code, out)
        result = {"ok": True, "output": out.value(), "dropped": out.dropped}
    except MemoryError:
        result = {"ok": False, "error": f"MemoryError: over the {memory_mb} MB memory limit"}
    except BaseException as error:  # every failure of the code is the tool's answer
        result = {"ok": False, "error": one_line(error)}
    sys.stdout = real_stdout
    real_stdout.write(json.dumps(result))
    real_stdout.flush()


if __name__ == "__main__":
    main()
