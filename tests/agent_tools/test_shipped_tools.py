"""The shipped calculator, the arithmetic rewards and the guess_number environment."""
from __future__ import annotations

import pytest

import agent_tools  # noqa: F401  (registers them)
from agent_tools.arithmetic import ArithmeticAnswer, TrajectoryReturn
from agent_tools.calculator import CalculatorOptions, evaluate
from agent_tools.guess_number import GuessNumber, GuessNumberOptions
from omni_rl.agent import TOOLS, Turn
from omni_rl.agent.components import ToolCall
from omni_rl.agent.runner import ToolRunner


@pytest.mark.parametrize("expression, value", [("7*8", 56), ("12*(3+4)", 84), ("-2**3", -8), ("7/2", 3.5)])
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, error", [
    ("__import__('os')", "is not a number or an arithmetic operation"),
    ("9**9**9", "exponent 387420489 is over the calculator's limit of 64"),
    ("7*", "is not an arithmetic expression"),
])
def test_the_calculator_refuses_what_is_not_arithmetic(expression, error):
    with pytest.raises(ValueError, match=error.replace("*", r"\*").replace("(", r"\(")):
        evaluate(expression)


def test_the_calculator_through_the_runner():
    runner = ToolRunner({"calculator": TOOLS.get("calculator")(CalculatorOptions())}, timeout_s=5, max_output_chars=50)
    assert runner.run(ToolCall("calculator", {"expression": "6*7"})).observation == "42"
    assert runner.run(ToolCall("calculator", {"expression": "1/0"})).observation == "error: division by zero"
    bad = runner.run(ToolCall("calculator", {"expression": "x+1"}))
    assert bad.error == "crashed" and "'x' is not a number" in bad.observation


def test_the_arithmetic_reward_reads_the_answer_and_the_trajectory():
    called = {"trajectory": {"tool_calls": [{"name": "calculator", "ok": True}]}}
    scores = ArithmeticAnswer(call_credit=0.3)(["56", "it is 56", "55", "55", ""], ["7*8"] * 5,
                                                [{}, {}, {}, called, {"expression": "1+1"}])
    assert scores == [1.0, 1.0, 0.0, 0.3, 0.0]
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        ArithmeticAnswer()(["1"], ["hello"], [{}])
    assert TrajectoryReturn()(["a"], ["p"], [{"trajectory": {"env_return": 0.7}}]) == [0.7]


def test_guess_number_answers_each_guess():
    env = GuessNumber(GuessNumberOptions(low=1, high=10), "p", {"secret": 6})
    assert env.step(Turn(0, "maybe 3")).observation == "higher"
    assert env.step(Turn(1, "9")).observation == "lower"
    assert env.step(Turn(2, "no idea")).reward == -0.1
    last = env.step(Turn(3, "6"))
    assert (last.observation, last.reward, last.done) == ("correct", 1.0, True)
