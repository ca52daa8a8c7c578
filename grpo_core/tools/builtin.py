"""The built-in tools: ``calculator`` (exact arithmetic on a walked ``ast``, never ``eval``) and ``python`` (a
program run in the bubblewrap sandbox of the code-execution reward, ``grpo_core.rewards.code``).

Both are bounded so that no call of the model's can hang or kill the trainer: the calculator refuses powers and
results past ``MAX_INT_BITS`` before computing them, and the python tool's process is killed at its wall-clock
limit, memory cap or output cap (no network inside). Failures come back as error results the model reads.
"""

from __future__ import annotations

import ast
import math
import operator
import signal
from collections.abc import Callable
from typing import Any

from grpo_core.rewards.code import SandboxLimits, check_sandbox, resolve_mode, run_in_sandbox
from grpo_core.tools.calls import ToolResult, truncate
from grpo_core.tools.schema import Tool, tool_from_function

MAX_EXPRESSION_CHARS = 1_000
MAX_INT_BITS = 4_096  # ~1,233 decimal digits: ample for arithmetic, and 9**9**9 is refused, not computed
PYTHON_LIMITS = SandboxLimits(timeout=5.0, memory_mb=512, max_output_bytes=64 << 10)
MAX_OUTPUT_CHARS = 2_000  # of the program's stdout, in the tool turn
_STDERR_TAIL_LINES = 8  # a traceback's last lines: where it failed and the exception
_STDERR_TAIL_CHARS = 600
_TIMEOUT_MARGIN = 10.0  # the Tool's own timeout over the sandbox's, so the sandbox kills the program first

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_ALLOWED = "only numbers, + - * / // % ** and parentheses are allowed"


# ---------------------------------------------------------------- calculator


def calculate(expression: str) -> str:
    """The value of an arithmetic ``expression``: an int printed as an int, a float as its ``repr``. ValueError
    saying what is wrong for anything else (names, calls, attributes, a result too large, division by zero)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression ({e.msg}); {_ALLOWED}") from None
    except (RecursionError, MemoryError):  # the parser's own limit on nesting
        raise ValueError("the expression is nested too deeply") from None
    try:
        value = _evaluate(tree.body)
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    return str(value) if isinstance(value, int) else repr(value)


def _evaluate(node: ast.expr) -> float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return _bounded(node.value)
        raise ValueError(f"{node.value!r} is not a number; {_ALLOWED}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("the result is too large") from None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):  # models write 2^10 for a power
        raise ValueError(f"^ is not a power here: write ** (2**10); {_ALLOWED}")
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed ({node.id}); {_ALLOWED}")
    if isinstance(node, ast.Call):
        raise ValueError(f"function calls are not allowed; {_ALLOWED}")
    if isinstance(node, ast.Attribute):
        raise ValueError(f"attribute access is not allowed; {_ALLOWED}")
    raise ValueError(f"{type(node).__name__} is not allowed; {_ALLOWED}")


def _check_power(base: float, exponent: float) -> None:
    """Refuse an integer power whose result would pass ``MAX_INT_BITS``, before computing it (Python would
    compute 9**387420489 for minutes). Float powers raise OverflowError on their own."""
    if (isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0
            and exponent * (abs(base).bit_length() - 1) > MAX_INT_BITS):  # a lower bound on the result's bits
        raise ValueError(f"the result is too large (over {MAX_INT_BITS} bits)")


def _bounded(value: Any) -> float:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise ValueError("the result is a complex number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"the result is too large (over {MAX_INT_BITS} bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number")
    return value


def calculator(expression: str) -> str | ToolResult:
    """Evaluate an arithmetic expression exactly: integers and decimals, + - * / // % ** (power) and parentheses.
    Integer arithmetic is exact (no rounding); / gives a decimal.

    Args:
        expression: the expression, e.g. "123*456" or "(2**10 - 1) / 3".
    """
    try:
        return calculate(expression)
    except ValueError as e:
        return ToolResult(content=f"error: {e}", error=True, name="calculator", seconds=0.0)


def calculator_tool() -> Tool:
    return tool_from_function(calculator)


# ---------------------------------------------------------------- python


def run_python(code: str, *, limits: SandboxLimits = PYTHON_LIMITS, sandbox: str | None = None,
               max_chars: int = MAX_OUTPUT_CHARS, allow_site_packages: bool = False,
               python: str | None = None) -> ToolResult:
    """Run ``code`` in the sandbox: its stdout (cut to ``max_chars``), or an error result with the reason, the
    stderr tail (the exception line) and what it printed before failing."""
    res = run_in_sandbox(code, limits=limits, sandbox=sandbox, python=python,
                         allow_site_packages=allow_site_packages)
    stdout = truncate(res.stdout, max_chars)
    if res.timed_out:
        problem = f"the program ran past its {limits.timeout:g} s time limit and was killed"
    elif res.output_exceeded:
        problem = f"the program printed more than {limits.max_output_bytes} bytes and was killed"
    elif res.returncode is not None and res.returncode < 0:
        problem = f"the program was killed by {_signal_name(-res.returncode)}"
    elif res.returncode != 0:
        problem = f"the program failed (exit status {res.returncode})"
    else:
        return ToolResult(content=stdout if stdout.strip() else "(no output: print() what you want to see)",
                          error=False, name="python", seconds=res.seconds)
    parts = [f"error: {problem}"]
    tail = _tail(res.stderr)
    if tail:
        parts.append(tail)
    if stdout.strip():
        parts.append(f"stdout before that:\n{stdout}")
    return ToolResult(content="\n".join(parts), error=True, name="python", seconds=res.seconds)


def _tail(stderr: str) -> str:
    """The last whole lines of ``stderr`` that fit ``_STDERR_TAIL_CHARS`` (at most ``_STDERR_TAIL_LINES``): a
    traceback's end, which names the line that failed and the exception."""
    kept: list[str] = []
    for line in reversed(stderr.rstrip().splitlines()[-_STDERR_TAIL_LINES:]):
        if kept and sum(map(len, kept)) + len(line) > _STDERR_TAIL_CHARS:
            break
        kept.append(line[-_STDERR_TAIL_CHARS:])
    return "\n".join(reversed(kept))


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    why = {"SIGXCPU": " (CPU time limit)", "SIGKILL": " (a limit)", "SIGSEGV": " (a crash)"}.get(name, "")
    return name + why


def python_tool(*, limits: SandboxLimits = PYTHON_LIMITS, sandbox: str | None = None,
                max_chars: int = MAX_OUTPUT_CHARS, allow_site_packages: bool = False, python: str | None = None,
                check: bool = True) -> Tool:
    """The ``python`` tool. ``check`` runs one program in the sandbox now, so a machine without a working sandbox
    fails when the tools are loaded (``SandboxUnavailable`` with the fix), not on the model's first call."""
    mode = resolve_mode(sandbox)
    if check:
        check_sandbox(mode, python)
    packages = "the standard library and the interpreter's installed packages" if allow_site_packages else \
        "the standard library only"
    description = (
        f"Run a Python 3 program and return what it prints to stdout. Each call is a fresh process ({packages}, "
        f"no network, no files kept between calls, {limits.timeout:g} s and {limits.memory_mb} MB at most): "
        f"define everything you use and print() the results. Output past {max_chars} characters is cut."
    )

    def run(code: str) -> ToolResult:
        return run_python(code, limits=limits, sandbox=mode, max_chars=max_chars,
                          allow_site_packages=allow_site_packages, python=python)

    parameters = {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "description": "the Python program; print() what you want to see"}}}
    return Tool(name="python", description=description, parameters=parameters, function=run,
                timeout=limits.timeout + _TIMEOUT_MARGIN)


BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {"calculator": calculator_tool, "python": python_tool}
