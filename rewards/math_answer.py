"""`math_answer`: 1.0 when the response's final answer equals the reference answer, else 0.0.

For text samples. The answer is the last `\\boxed{}` (else `<answer>` tag) of the response; the
reference is `metadata[i]["ground_truth"]` (checked on every prompt before any model loads by
`check_math_item`), a value or a list of accepted values. Answers are compared after LaTeX
normalisation, numbers with exact rational arithmetic (`0.75` == `3/4` == `\\frac{6}{8}`),
percentages, tuples and a leading `x =` handled; `symbolic=True` adds a `math_verify` check.
The full rules are in docs/models.md (Reward details). MMK12's `0.9 * accuracy + 0.1 * format`
is two reward entries:

    - {name: math_answer, weight: 0.9}
    - {name: format, weight: 0.1, reward_options: {pattern: think_boxed}}

Left out on purpose: float tolerances, units, matrices, sets, and answers without a box or tag.
"""
from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction
from typing import Any, Callable, Optional, Sequence

from omni_rl.reward import register_reward
from omni_rl.reward.inputs import RewardInputError, check_batch, ground_truths, to_text_list
from rewards.answer_extraction import extract_answer_tag, extract_boxed, has_boxed, read_braced

# ------------------------------------------------------------------------------------------
# Extraction
# ------------------------------------------------------------------------------------------


def extract_final_answer(text: str) -> Optional[str]:
    """The response's final answer: the last `\\boxed{}`, else the last `<answer>` tag, else None."""
    if has_boxed(text):
        answer = extract_boxed(text)
    else:
        answer = extract_answer_tag(text)
    if answer is None or not answer.strip():
        return None
    return answer


# ------------------------------------------------------------------------------------------
# Normalisation
# ------------------------------------------------------------------------------------------

_TEXT_CMD_RE = re.compile(r"\\(?:text|textrm|textup|textit|textnormal|textbf|mbox|mathrm|operatorname)\s*(?=\{)")
_DELETE_RES = [
    re.compile(r"\\(?:left|right)\.?(?![A-Za-z])"),      # \left( \right)  \left. \right.
    re.compile(r"\\[bB]ig{1,2}[lr]?(?![A-Za-z])"),         # \big( \Bigr)
    re.compile(r"\\(?:displaystyle|textstyle|scriptstyle)(?![A-Za-z])"),
    re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])"),  # degree signs
    re.compile(r"\{,\}"),                                     # 1{,}000
    re.compile(r"\\[()\[\]]"),                                # \( \) \[ \] math delimiters
]
_SPACE_RE = re.compile(r"\\(?:[!,;: ]|(?:quad|qquad)(?![A-Za-z]))|~")
_TWO_ARG_CMDS = ("frac",)  # \sqrt takes one


def normalize_answer(text: str) -> str:
    """Strip LaTeX noise and whitespace (see the module docstring); returns a comparable string."""
    s = str(text).strip()
    s = s.replace("$", "").replace("\u2212", "-").replace("\u00d7", "\\times ").replace("\u00f7", "\\div ")
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = s.replace("\\%", "%")
    for pattern in _DELETE_RES:
        s = pattern.sub("", s)
    s = _SPACE_RE.sub(" ", s).strip().rstrip(".")
    s = _strip_text_groups(s)
    s = _brace_arguments(s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    if s.startswith("=") and s.count("=") == 1:  # what is left of `\text{Area} = 5`
        s = s[1:]
    return s


def _strip_text_groups(s: str) -> str:
    """Drop leading/trailing `\\text{...}` groups (units, labels) when something else remains;
    unwrap every other text group to its content."""
    groups = []  # (start, end, content)
    for match in _TEXT_CMD_RE.finditer(s):
        braced = read_braced(s, match.end())
        if braced is not None:
            groups.append((match.start(), braced[1], braced[0]))
    if not groups:
        return s
    keep = [True] * len(groups)
    # Trailing groups (optionally followed by a power, `\text{cm}^2`), then leading ones.
    end = len(s.rstrip())
    for k in range(len(groups) - 1, -1, -1):
        start, stop, _ = groups[k]
        tail = s[stop:end]
        if re.fullmatch(r"\s*(\^\s*(\{\s*\d+\s*\}|\d))?\s*", tail):
            keep[k] = False
            groups[k] = (start, end, groups[k][2])  # the unit's power goes with it
            end = start
        else:
            break
    begin = 0
    for k in range(len(groups)):
        start, stop, _ = groups[k]
        if keep[k] and not s[begin:start].strip():
            keep[k] = False
            begin = stop
        else:
            break
    stripped = _replace_groups(s, groups, [content if kept else " " for (_, _, content), kept in zip(groups, keep)])
    if re.search(r"[0-9A-Za-z]", stripped):
        return stripped
    # Nothing but text: the text is the answer (`\text{yes}`).
    return _replace_groups(s, groups, [content for _, _, content in groups])


def _replace_groups(s: str, groups: list[tuple[int, int, str]], replacements: list[str]) -> str:
    pieces, pos = [], 0
    for (start, stop, _), replacement in zip(groups, replacements):
        pieces += [s[pos:start], replacement]
        pos = stop
    pieces.append(s[pos:])
    return "".join(pieces)


def _brace_arguments(s: str) -> str:
    r"""`\frac34` -> `\frac{3}{4}`, `\frac 3{4}` -> `\frac{3}{4}`, `\sqrt2` -> `\sqrt{2}`."""
    out = []
    i = 0
    while i < len(s):
        match = re.match(r"\\(frac|sqrt)(?![A-Za-z])", s[i:])
        if not match:
            out.append(s[i])
            i += 1
            continue
        name = match.group(1)
        out.append("\\" + name)
        i += match.end()
        for _ in range(2 if name in _TWO_ARG_CMDS else 1):
            while i < len(s) and s[i] == " ":
                i += 1
            if i >= len(s):
                break
            if s[i] == "{":
                braced = read_braced(s, i)
                if braced is None:
                    break
                out.append("{" + _brace_arguments(braced[0]) + "}")
                i = braced[1]
            elif s[i] == "[" and name == "sqrt":  # \sqrt[3]{x}: leave the index alone
                break
            elif s[i] == "\\":
                break  # a command argument: leave as written
            else:
                out.append("{" + s[i] + "}")
                i += 1
    return "".join(out)


# ------------------------------------------------------------------------------------------
# Exact rational evaluation
# ------------------------------------------------------------------------------------------

_MAX_NUMERIC_CHARS = 500
_MAX_ANSWER_CHARS = 2000
_MAX_POWER_BITS = 10_000
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?%?")
_NUMBER_RE = re.compile(r"(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class _ParseFailure(Exception):
    pass


class _RationalParser:
    """Recursive descent over a normalised (whitespace-free) string; see `evaluate_rational`.

    expr  := term (("+" | "-") term)*
    term  := unary (("*" | "/" | \\times | \\cdot | \\div) unary)*
    unary := ("+" | "-") unary | power
    power := atom ("^" (digit | "{" expr "}" | "(" expr ")"))?     integer exponents only
    atom  := number | "(" expr ")" | "{" expr "}" | \\frac "{" expr "}" "{" expr "}"
    """

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def parse(self) -> Fraction:
        value = self.expr()
        if self.i != len(self.s):
            raise _ParseFailure
        return value

    def _take(self, token: str) -> bool:
        if self.s.startswith(token, self.i):
            if token[0] == "\\" and self.i + len(token) < len(self.s) and self.s[self.i + len(token)].isalpha():
                return False  # \times is not \timesx
            self.i += len(token)
            return True
        return False

    def _expect(self, token: str) -> None:
        if not self._take(token):
            raise _ParseFailure

    def expr(self) -> Fraction:
        value = self.term()
        while True:
            if self._take("+"):
                value += self.term()
            elif self._take("-"):
                value -= self.term()
            else:
                return value

    def term(self) -> Fraction:
        value = self.unary()
        while True:
            if self._take("*") or self._take("\\times") or self._take("\\cdot"):
                value *= self.unary()
            elif self._take("/") or self._take("\\div"):
                divisor = self.unary()
                if divisor == 0:
                    raise _ParseFailure
                value /= divisor
            else:
                return value

    def unary(self) -> Fraction:
        if self._take("-"):
            return -self.unary()
        if self._take("+"):
            return self.unary()
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if not self._take("^"):
            return base
        if self.i < len(self.s) and self.s[self.i].isdigit():
            exponent = Fraction(int(self.s[self.i]))
            self.i += 1
        elif self._take("{"):
            exponent = self.expr()
            self._expect("}")
        elif self._take("("):
            exponent = self.expr()
            self._expect(")")
        else:
            raise _ParseFailure
        if exponent.denominator != 1:
            raise _ParseFailure  # a root: not rational in general
        e = int(exponent)
        size = max(base.numerator.bit_length(), base.denominator.bit_length())
        if abs(e) * size > _MAX_POWER_BITS or (base == 0 and e < 0):
            raise _ParseFailure
        return base**e

    def atom(self) -> Fraction:
        if self._take("("):
            value = self.expr()
            self._expect(")")
            return value
        if self._take("{"):
            value = self.expr()
            self._expect("}")
            return value
        if self._take("\\frac"):
            self._expect("{")
            numerator = self.expr()
            self._expect("}")
            self._expect("{")
            denominator = self.expr()
            self._expect("}")
            if denominator == 0:
                raise _ParseFailure
            return numerator / denominator
        match = _NUMBER_RE.match(self.s, self.i)
        if not match:
            raise _ParseFailure
        self.i = match.end()
        mantissa, exponent = match.group(1), match.group(2)
        if exponent and abs(int(exponent[1:])) > 400:
            raise _ParseFailure
        return Fraction(mantissa.rstrip(".") + (exponent or ""))


def evaluate_rational(text: str) -> Optional[Fraction]:
    """The exact value of a normalised numeric expression, or None if it is not one."""
    if not text or len(text) > _MAX_NUMERIC_CHARS:
        return None
    if _THOUSANDS_RE.fullmatch(text):
        text = text.replace(",", "")
    try:
        return _RationalParser(text).parse()
    except (_ParseFailure, RecursionError, ValueError, ZeroDivisionError, OverflowError):
        return None


# ------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i
            start += 1
    parts.append(text[start:])
    return parts


def _as_number(text: str) -> Optional[tuple[Fraction, bool]]:
    """(value, written_as_percent) for a normalised numeric string, else None."""
    percent = text.endswith("%")
    value = evaluate_rational(text[:-1] if percent else text)
    return None if value is None else (value, percent)


def _as_tuple(text: str) -> Optional[tuple[str, str, tuple[Fraction, ...]]]:
    """(open bracket, close bracket, values) for `(1,2)`, `[1,2)`, `1,2`; else None."""
    if _THOUSANDS_RE.fullmatch(text):
        return None
    open_, close, inner = "", "", text
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]":
        open_, close, inner = text[0], text[-1], text[1:-1]
    parts = _split_top_level(inner)
    if len(parts) < 2:
        return None  # `(3)` is a parenthesised number, handled by _as_number
    values = []
    for part in parts:
        number = _as_number(part)
        if number is None:
            return None
        values.append(number[0])
    return open_, close, tuple(values)


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool], percent: bool) -> bool:
    (x, x_pct), (y, y_pct) = a, b
    if x == y:
        return True
    if percent and x_pct != y_pct:
        # One side is a percentage: 50% also equals 0.5.
        return (x / 100 == y) if x_pct else (y / 100 == x)
    return False


_EQUATION_RE = re.compile(r"^([A-Za-z]|\\[A-Za-z]+)(_\{?\w+\}?)?=(.+)$")


def _split_variable(text: str) -> tuple[Optional[str], str]:
    """`x=3` -> ("x", "3") when the right side is a number or a tuple; else (None, text)."""
    match = _EQUATION_RE.match(text)
    if match and "=" not in match.group(3):
        rest = match.group(3)
        if _as_number(rest) is not None or _as_tuple(rest) is not None:
            return match.group(1) + (match.group(2) or ""), rest
    return None, text


def answers_equal(answer: str, reference: str, *, percent: bool = True) -> bool:
    """Whether two answer strings are equal under the rules of the module docstring."""
    if max(len(answer), len(reference)) > _MAX_ANSWER_CHARS:
        return answer.strip() == reference.strip()  # not a final answer; keep the cost bounded
    a, b = normalize_answer(answer), normalize_answer(reference)
    if not a or not b:
        return False
    if a == b:
        return True
    (var_a, rest_a), (var_b, rest_b) = _split_variable(a), _split_variable(b)
    if var_a is None or var_b is None or var_a == var_b:
        a, b = rest_a, rest_b
    tuple_a, tuple_b = _as_tuple(a), _as_tuple(b)
    if tuple_a is not None or tuple_b is not None:
        return tuple_a is not None and tuple_a == tuple_b
    number_a, number_b = _as_number(a), _as_number(b)
    if number_a is not None and number_b is not None:
        return _numbers_equal(number_a, number_b, percent)
    return a == b


def reference_answers(ground_truth: Any, index: int) -> list[str]:
    """The accepted answers a ground-truth value stands for (see the module docstring)."""
    values = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    if not values:
        raise RewardInputError(
            f"reward 'math_answer': metadata[{index}]['ground_truth'] is an empty list; expected "
            f"the reference answer (a string or number) or a non-empty list of accepted answers"
        )
    out = []
    for value in values:
        if isinstance(value, str):
            boxed = extract_boxed(value) if has_boxed(value) else None
            if boxed is not None:
                value = boxed
            elif "####" in value:
                value = value.rsplit("####", 1)[1]
            out.append(value)
        elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
            out.append(str(int(value)))
        elif isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            out.append(repr(float(value)))
        else:
            raise RewardInputError(
                f"reward 'math_answer': metadata[{index}]['ground_truth'] is {value!r} "
                f"({type(value).__name__}); expected a string, an int, a finite float, or a list "
                f"of them. Fix that row of the prompt data"
            )
    return out


class MathAnswerScorer:
    """Scores each response 1.0 when its final answer matches `metadata[i]["ground_truth"]`."""

    def __init__(self, percent: bool, symbolic: bool):
        if not isinstance(percent, bool):
            raise ValueError(f"math_answer: percent={percent!r}; expected true or false")
        if not isinstance(symbolic, bool):
            raise ValueError(f"math_answer: symbolic={symbolic!r}; expected true or false")
        self.percent = percent
        self._symbolic: Optional[Callable[[str, str], bool]] = _math_verify_checker() if symbolic else None

    def __call__(self, samples: Sequence[str], prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> list[float]:
        check_batch(samples, prompts, metadata)
        texts = to_text_list(samples)
        references = [reference_answers(gt, i) for i, gt in enumerate(ground_truths(metadata, "math_answer"))]
        return [self.score_one(text, refs) for text, refs in zip(texts, references)]

    def score_one(self, response: str, references: Sequence[str]) -> float:
        answer = extract_final_answer(response)
        if answer is None:
            return 0.0
        if any(answers_equal(answer, ref, percent=self.percent) for ref in references):
            return 1.0
        if self._symbolic is not None and any(self._symbolic(answer, ref) for ref in references):
            return 1.0
        return 0.0

    def __repr__(self) -> str:
        return f"MathAnswerScorer(percent={self.percent}, symbolic={self._symbolic is not None})"


def _math_verify_checker() -> Callable[[str, str], bool]:
    try:
        import math_verify
    except ImportError as err:
        raise ImportError(
            "math_answer: symbolic=true needs the math-verify package, which is not installed; "
            "pip install 'math-verify[antlr4_13_2]', or set symbolic=false to use the exact "
            "rational checker alone"
        ) from err

    def check(answer: str, reference: str) -> bool:
        try:
            gold = math_verify.parse(f"${reference}$")
            guess = math_verify.parse(f"${answer}$")
            return bool(gold) and bool(guess) and bool(math_verify.verify(gold, guess))
        except Exception:  # a parser failure or timeout means "not shown equal"
            return False

    return check


def check_math_item(prompt: str, metadata: dict[str, Any]) -> Optional[str]:
    """Why this prompt has no reference answer the reward can read, or None: run on every prompt
    before any model loads (`register_reward(check_item=...)`)."""
    if metadata.get("ground_truth") is None:
        return (f"has no reference answer: its metadata has no 'ground_truth' (keys: {sorted(metadata)}); give "
                f"every row a 'ground_truth' (or verl's reward_model.ground_truth) in a chat .jsonl or .parquet file")
    try:
        reference_answers(metadata["ground_truth"], 0)
    except RewardInputError as err:
        return "has an unusable reference answer: " + str(err).replace("reward 'math_answer': metadata[0]", "metadata")
    return None


@register_reward("math_answer", check_item=check_math_item)
def math_answer(*, percent: bool = True, symbolic: bool = False) -> MathAnswerScorer:
    """1.0 when the last \\boxed{} (else <answer>) answer equals metadata["ground_truth"], else 0.0."""
    return MathAnswerScorer(percent, symbolic)
