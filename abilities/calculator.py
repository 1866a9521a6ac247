"""calculator: arithmetic and unit-free math, evaluated over a parsed tree, never eval().

Bounds keep hostile input from hanging the caller: the expression length, the
tree size, exponent sizes, factorial arguments and the bit length of every
integer intermediate are all capped.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, Final

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult

MAX_LENGTH: Final = 500
MAX_NODES: Final = 200
MAX_DEPTH: Final = 40
MAX_EXPONENT: Final = 10_000
MAX_INT_BITS: Final = 4_096
MAX_FACTORIAL: Final = 500
MAX_ROUND_DIGITS: Final = 400
SHOWN_ARG_CHARS: Final = 40

Number = int | float


class CalcError(Exception):
    """Bad input: carries the code, message and hint of the error result."""

    def __init__(self, message: str, hint: str, code: str = "invalid-param") -> None:
        super().__init__(message)
        self.code, self.hint = code, hint


def _check(value: Any) -> Number:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalcError("the expression does not produce a number", "use numbers only")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalcError(
            f"an intermediate result exceeds {MAX_INT_BITS} bits",
            "the numbers are too large; reduce exponents or use floats",
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError(
            "the result is not a finite number", "use smaller numbers or check the domain"
        )
    return value


def _pow(a: Number, b: Number) -> Number:
    if abs(b) > MAX_EXPONENT:
        raise CalcError(f"exponent {b} exceeds {MAX_EXPONENT}", "use a smaller exponent")
    if isinstance(a, int) and isinstance(b, int) and b > 0:
        # |a|^b has about b*log2|a| bits: refuse before computing, not after.
        if a not in (0, 1, -1) and b * math.log2(abs(a)) > MAX_INT_BITS:
            raise CalcError(
                f"{a}**{b} would exceed {MAX_INT_BITS} bits", "use a float base, e.g. 2.0**5000"
            )
    if a == 0 and b < 0:
        raise CalcError(
            "0 cannot be raised to a negative power (it divides by zero)",
            "use a non-zero base or a non-negative exponent",
        )
    if a < 0 and isinstance(b, float) and not b.is_integer():
        raise CalcError(
            "a negative number to a fractional power has no real value",
            "use a whole exponent, or abs() of the base",
        )
    try:
        return _check(operator.pow(a, b))
    except OverflowError:
        raise CalcError("the result overflows a float", "use smaller numbers") from None


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if isinstance(ndigits, bool) or not isinstance(ndigits, int):
        raise CalcError("round() takes a whole number of digits", "e.g. round(3.14159, 2)")
    if abs(ndigits) > MAX_ROUND_DIGITS:
        # round(5, -10**20) would compute 10**(10**20): refuse before trying.
        raise CalcError(f"round() digits are capped at +/-{MAX_ROUND_DIGITS}", "use fewer digits")
    return round(x, ndigits)


def _short(value: Number) -> str:
    text = str(value)
    return text if len(text) <= SHOWN_ARG_CHARS else f"{text[:20]}...({len(text)} digits)"


def _factorial(n: Number) -> Number:
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or n < 0:
        raise CalcError(
            "factorial takes a non-negative integer", "pass a whole number, e.g. factorial(10)"
        )
    if n > MAX_FACTORIAL:
        raise CalcError(f"factorial is capped at {MAX_FACTORIAL}", "use a smaller argument")
    return math.factorial(n)


def _short_text(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 2 * SHOWN_ARG_CHARS else text[: 2 * SHOWN_ARG_CHARS] + "..."


def _div(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero", "check the divisor")
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero", "check the divisor")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("modulo by zero", "check the divisor")
    return a % b


BINARY: Final[dict[type, Callable[[Number, Number], Number]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _div,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
}
UNARY: Final[dict[type, Callable[[Number], Number]]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
FUNCTIONS: Final[dict[str, Callable[..., Number]]] = {
    "sqrt": math.sqrt,
    "cbrt": math.cbrt,
    "exp": math.exp,
    "ln": math.log,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "atan2": math.atan2,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "degrees": math.degrees,
    "radians": math.radians,
    "abs": abs,
    "round": _round,
    "floor": math.floor,
    "ceil": math.ceil,
    "min": min,
    "max": max,
    "factorial": _factorial,
    "gcd": math.gcd,
    "hypot": math.hypot,
}
CONSTANTS: Final[dict[str, float]] = {"pi": math.pi, "e": math.e, "tau": math.tau}


# A percent sign right after a number, not followed by another number (that is the
# modulo operator, as in 10 % 3): "15%", "15% of 240", "15% * 240", "240 * 15%".
_PERCENT: Final = re.compile(r"(\d+(?:\.\d+)?)\s*%(?!\s*[\d(.])(\s*of\b)?", re.I)
# "17 x 23", "2 X 3": the letter x between two numbers is a multiplication sign.
_TIMES: Final = re.compile(r"(?<=[\d)])\s*[xX]\s*(?=[\d(])")
# "1,234,567": thousands separators (a comma inside a function's arguments has spaces
# or is not followed by exactly three digits and a non-digit).
_THOUSANDS: Final = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _normalise(expression: str) -> str:
    """The expression as Python arithmetic: typographic operators people paste (the
    multiplication, division and minus signs), ``^`` for a power, percentages, an ``x``
    between numbers, thousands separators, and ``of`` after a percentage."""
    text = (
        expression.replace("^", "**")
        .replace("\u00d7", "*")
        .replace("\u00f7", "/")
        .replace("\u2212", "-")
    )
    text = _TIMES.sub("*", text)
    if not re.search(r"[a-z_]\w*\s*\(", text, re.I):  # no function call: no argument commas
        text = _THOUSANDS.sub("", text)
    return _PERCENT.sub(lambda m: f"({m[1]}/100)" + ("*" if m[2] else ""), text)


def evaluate(expression: str) -> Number:
    """Evaluate a math expression safely; raises CalcError with a hint on bad input."""
    if len(expression) > MAX_LENGTH:
        raise CalcError(
            f"the expression is longer than {MAX_LENGTH} characters", "split it into smaller steps"
        )
    if not expression.strip():
        raise CalcError("the expression is empty", "pass the arithmetic the user asked for")
    try:
        tree = ast.parse(_normalise(expression), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError(
            "the expression is not valid arithmetic",
            "use numbers, + - * / // % ** ( ), and functions like sqrt(2)",
        ) from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise CalcError(
            f"the expression has more than {MAX_NODES} parts", "split it into smaller steps"
        )
    return _eval(tree.body, 0)


def _eval(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalcError("the expression is nested too deeply", "simplify the parentheses")
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        try:
            return _check(BINARY[type(node.op)](left, right))
        except OverflowError:
            raise CalcError("the result overflows a float", "use smaller numbers") from None
        except ZeroDivisionError:
            raise CalcError("division by zero", "check the divisor") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return _check(UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        if node.keywords or len(node.args) > 8:
            raise CalcError(
                f"{node.func.id}() takes only a few positional numbers", "e.g. max(1, 2, 3)"
            )
        args = [_eval(a, depth + 1) for a in node.args]
        try:
            return _check(FUNCTIONS[node.func.id](*args))
        except CalcError:
            raise
        except (ValueError, TypeError, OverflowError) as exc:
            raise CalcError(
                f"{node.func.id}() cannot take "
                f"{', '.join(map(_short, args)) or 'no arguments'}: {_short_text(exc)}",
                "check the function's domain and argument count",
            ) from None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        raise CalcError(
            f"unknown function {node.func.id!r}", "known: " + ", ".join(sorted(FUNCTIONS))
        )
    if isinstance(node, ast.Name):
        raise CalcError(
            f"unknown name {node.id!r}", "known: " + ", ".join(sorted([*FUNCTIONS, *CONSTANTS]))
        )
    raise CalcError(
        f"{type(node).__name__} is not allowed in an expression",
        "use numbers, arithmetic operators, parentheses and math functions only",
    )


class CalculatorParams(msgspec.Struct, forbid_unknown_fields=True):
    """Evaluate one arithmetic expression."""

    expression: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=MAX_LENGTH,
            description="<expression>: numbers, + - * / ** ( ) and functions like sqrt(<x>)",
        ),
    ]


class Calculator(Ability):
    name = "calculator"
    summary = (
        "Evaluates arithmetic and math expressions exactly: adds, subtracts, multiplies, "
        "divides, percentages, powers, square roots, logarithms, trigonometry, factorials."
    )
    tooltip = "Arithmetic and math expressions"
    examples = (
        "what is 17.5 percent of 240",
        "calculate 1234 times 5678",
        "square root of 2",
        "how much is 2 to the power of 64",
        "split a 187 euro bill between 4 people",
        "what's the sine of 30 degrees",
        "compute (3 + 4) * 12 / 7",
    )
    Params = CalculatorParams
    aliases = {
        "expr": "expression",
        "input": "expression",
        "query": "expression",
        "math": "expression",
        "formula": "expression",
        "equation": "expression",
    }
    timeout = 5.0
    # Pure and bounded: run on the dispatcher's thread (actors/calls/executors/immediate.py).
    isolation = "immediate"

    def run(self, params: CalculatorParams) -> ToolResult:
        try:
            value = evaluate(params.expression)
        except CalcError as exc:
            return ToolResult.error(
                exc.code, str(exc) + ".", hint=exc.hint, meta={"param": "expression"}
            )
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            shown: Number = int(value)
        else:
            shown = value
        text = str(shown)
        if len(text) > 2000:
            text = f"{text[:40]}...({len(text)} digits)"
        return ToolResult.success({"expression": params.expression, "result": text})
