"""`calculator`: evaluates an arithmetic expression (numbers, + - * / // % **, parentheses).

Parsed with `ast` and evaluated node by node, never with `eval`: anything else (names, calls,
attributes) is an error the model reads. Exponents are bounded so that `9**9**9` cannot stall
the tool (the runner's timeout would cut it off anyway, but a thread that computes forever keeps
a core busy).
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass

from omni_rl.agent import Tool, register_tool
from omni_rl.option import ComponentOptions, option

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


@dataclass
class CalculatorOptions(ComponentOptions):
    max_exponent: int = option(64, "The largest exponent ** takes (a larger one is an error observation).")
    max_chars: int = option(200, "The longest expression evaluated.")

    def check(self) -> None:
        if self.max_exponent < 1 or self.max_chars < 1:
            raise ValueError(f"max_exponent={self.max_exponent}, max_chars={self.max_chars}: expected both >= 1")


def evaluate(expression: str, max_exponent: int = 64) -> int | float:
    """The value of an arithmetic expression; ValueError naming what is not arithmetic."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"{expression!r} is not an arithmetic expression ({err.msg})") from None

    def value(node: ast.AST):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
                raise ValueError(f"exponent {right} is over the calculator's limit of {max_exponent}")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError(f"{ast.unparse(node)!r} is not a number or an arithmetic operation")

    return value(tree.body)


def format_number(x: int | float) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


@register_tool("calculator")
class Calculator(Tool):
    description = "Evaluate an arithmetic expression such as 12*(3+4)."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The expression, e.g. 37*48"}},
        "required": ["expression"],
    }
    Options = CalculatorOptions

    def __call__(self, arguments: dict) -> str:
        expression = arguments["expression"]
        if len(expression) > self.options.max_chars:
            raise ValueError(f"the expression is {len(expression)} characters, over {self.options.max_chars}")
        try:
            return format_number(evaluate(expression, self.options.max_exponent))
        except ZeroDivisionError:
            return "error: division by zero"
