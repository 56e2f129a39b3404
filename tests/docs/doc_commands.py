"""The shell commands the documentation shows, and a cheap check of each.

`extract(path)` finds the commands of one Markdown file: every fenced block in a shell language
(bash, sh, shell, console) and every inline code span that starts with `python ` or
`pip install `. A fenced block may carry a marker on the line before it,

    <!-- doc-command: needs-gpu planned (issue 24: rollout.backend_options) -->

whose words say why it is not run here (`needs-gpu`, `needs-weights`, `needs-docker`,
`needs-cluster`) or that it uses a config layout still being built (`planned`); words in
brackets are a comment.

`check(command)` returns the problems of one command (every line of a block), [] when it is
fine. What it checks, without training or downloading anything:

- `python main_omni.py ARGS`: the config composes (`omni_rl.compose.load_config`, so every key,
  recipe and registered name exists), or in a block marked `needs-...` (no GPU or weights here,
  so no composing) that the recipe exists and every key is in the schema; `--help` and
  `--options` run the CLI.
- `python -m pytest ARGS`: every test path exists.
- `python -m MODULE ARGS` and `python SCRIPT.py ARGS`: the module or script exists and declares
  every `--flag` the command passes (argparse's `add_argument` in its source).
- `python -c CODE`: every name it imports exists.
- `pip install`: the extras named exist in pyproject.toml; `mkdocs build`: mkdocs.yml exists;
  `docker build -f FILE`: FILE exists; `docker run ... main_omni.py ARGS`: as above, static.
- every argument that names a path under the repository's own folders exists.

`missing_paths(path)` lists the repository paths a page names in code spans that do not exist.

A program it has no check for is a problem too, so a new kind of command gets a check (or a
marker) rather than going unchecked.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import typing
from dataclasses import dataclass, is_dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
REASONS = {"needs-gpu", "needs-weights", "needs-docker", "needs-cluster"}
MARKER_WORDS = REASONS | {"planned"}
# Arguments under these folders name files of the repository; they must exist.
REPO_DIRS = ("omni_rl", "adapters", "rewards", "recipes", "benchmarks", "docker", "tests", "docs", ".ci")
# Programs that are dependencies or system tools and need nothing checked beyond their arguments.
PLAIN_PROGRAMS = {"ray", "tensorboard", "cd"}

MARKER = re.compile(r"^\s*<!--\s*doc-command:\s*(?P<words>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w-]*)")
INLINE = re.compile(r"`([^`]+)`")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|"}


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int
    text: str                      # a block's command lines, continuations joined; or one inline span
    marks: frozenset[str] = frozenset()
    inline: bool = False

    @property
    def where(self) -> str:
        return f"{_display(self.path)}:{self.line}"


def _display(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _marker_words(text: str) -> frozenset[str]:
    return frozenset(re.sub(r"\([^)]*\)", " ", text).split())


def extract(path: Path) -> tuple[list[DocCommand], list[str]]:
    """The commands of one Markdown file, and the problems of its markup (an unknown marker
    word, a marker not followed by a shell block, a command in a fence without a shell language)."""
    lines = path.read_text().splitlines()
    commands: list[DocCommand] = []
    problems: list[str] = []
    prose: list[tuple[int, str]] = []
    pending: tuple[int, frozenset[str]] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        if marker:
            words = _marker_words(marker["words"])
            unknown = words - MARKER_WORDS
            if unknown or not words:
                problems.append(f"{_display(path)}:{i + 1}: doc-command marker {marker['words']!r}: "
                                f"expected words from {sorted(MARKER_WORDS)}")
            pending = (i + 1, words)
            i += 1
            continue
        fence = FENCE.match(line)
        if not fence:
            if line.strip() and pending is not None:
                problems.append(f"{_display(path)}:{pending[0]}: a doc-command marker must stand on the "
                                f"line before a ```bash block")
                pending = None
            prose.append((i + 1, line))
            i += 1
            continue
        start, lang, close = i + 1, fence["lang"].lower(), fence["fence"]
        body: list[tuple[int, str]] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(close):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1  # the closing fence
        marks = pending[1] if pending else frozenset()
        if pending and lang not in SHELL_LANGUAGES:
            problems.append(f"{_display(path)}:{pending[0]}: a doc-command marker stands before a "
                            f"```{lang or ''} block, not a shell block")
        pending = None
        if lang in SHELL_LANGUAGES:
            commands.extend(_block_commands(path, body, marks))
        elif lang == "" and any(re.match(r"\s*(python|pip) ", text) for _, text in body):
            problems.append(f"{_display(path)}:{start}: a command in a ``` block without a language: "
                            f"fence it as ```bash so that it is checked (```text for a synopsis)")
    commands.extend(_inline_commands(path, prose))
    return commands, problems


def _block_commands(path: Path, body: list[tuple[int, str]], marks: frozenset[str]) -> list[DocCommand]:
    """One block is one case: its command lines (continuations joined, comments and blank lines
    dropped), one per line of `text`."""
    lines: list[str] = []
    joined, first = "", None
    for number, text in body:
        stripped = text.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        if first is None:
            first = number
        if stripped.endswith("\\"):
            joined += stripped[:-1] + " "
            continue
        joined += stripped
        if joined.strip() and not joined.strip().startswith("#"):
            lines.append(joined.strip())
        joined = ""
    if not lines:
        return []
    return [DocCommand(path, body[0][0] - 1, "\n".join(lines), marks)]


def _inline_commands(path: Path, prose: list[tuple[int, str]]) -> list[DocCommand]:
    """Code spans that start with `python ` or `pip install `; a span may wrap across lines of
    one paragraph."""
    out: list[DocCommand] = []
    paragraph: list[tuple[int, str]] = []
    for number, text in [*prose, (0, "")]:
        if text.strip():
            paragraph.append((number, text))
            continue
        if paragraph:
            joined = " ".join(t.strip() for _, t in paragraph)
            for match in INLINE.finditer(joined):
                span = " ".join(match[1].split())
                if span.startswith(("python ", "pip install ")):
                    out.append(DocCommand(path, paragraph[0][0], span, inline=True))
        paragraph = []
    return out


PATH_SPAN = re.compile(r"`((?:%s)/[^`\s]*)`" % "|".join(re.escape(d) for d in REPO_DIRS))


def missing_paths(path: Path) -> list[str]:
    """Repository paths the page names in code spans (`omni_rl/rollout/base.py`) that do not
    exist; spans with a placeholder (NNNNNN, NAME, *, ...) are patterns, not paths."""
    problems = []
    for match in PATH_SPAN.finditer(path.read_text()):
        name = match[1]
        if _placeholder(name) or any(c in name for c in "*{"):
            continue
        if not (ROOT / name.rstrip("/")).exists():
            line = path.read_text().count("\n", 0, match.start()) + 1
            problems.append(f"{_display(path)}:{line}: `{name}` does not exist")
    return problems


# ------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------


def split_commands(text: str) -> list[list[str]]:
    """One shell line -> its simple commands' words (comments dropped, split at && ; | ||,
    leading VAR=value assignments dropped)."""
    words = shlex.split(text, comments=True)
    out, current = [], []
    for word in [*words, ";"]:
        if word in SEPARATORS:
            while current and ENV_ASSIGNMENT.match(current[0]):
                current.pop(0)
            if current:
                out.append(current)
            current = []
        else:
            current.append(word)
    return out


def check(command: DocCommand) -> list[str]:
    static = bool(command.marks & REASONS)
    problems: list[str] = []
    for line in command.text.splitlines():
        try:
            parts = split_commands(line)
        except ValueError as err:
            problems.append(f"cannot parse {line!r}: {err}")
            continue
        for words in parts:
            problems += check_words(words, static)
    return problems


def check_words(words: list[str], static: bool) -> list[str]:
    program, args = words[0], words[1:]
    problems = repo_path_problems(args)
    if program in ("python", "python3"):
        problems += _check_python(args, static)
    elif program == "pip":
        problems += _check_pip(args)
    elif program == "mkdocs":
        if not (ROOT / "mkdocs.yml").is_file():
            problems.append("mkdocs: there is no mkdocs.yml at the repository root")
    elif program == "docker":
        problems += _check_docker(args)
    elif program not in PLAIN_PROGRAMS:
        problems.append(f"no check for the program {program!r}: add one to tests/docs/doc_commands.py, "
                        f"or mark the block (<!-- doc-command: needs-... -->)")
    return problems


# What the docs write for "fill this in": recipe=NAME, step_NNNNNN, OUTPUT_DIR, <head-ip>, ...
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|N{3,}|(?<![A-Za-z])(?:NAME|DIR|OUTPUT_DIR|OLD_CHECKOUT|HEAD_IP|R|N)(?![A-Za-z])")


def _placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.search(word))


def repo_path_problems(args: list[str]) -> list[str]:
    problems = []
    for arg in args:
        value = arg.split("=", 1)[1] if "=" in arg and not arg.startswith("-") else arg
        value = value.split("::", 1)[0]
        if "/" not in value or _placeholder(value) or value.startswith(("-", "/", "http")):
            continue
        first = value.lstrip("./").split("/", 1)[0]
        if first in REPO_DIRS and not (ROOT / value).exists():
            problems.append(f"{value}: no such file or folder in the repository")
    return problems


def _check_python(args: list[str], static: bool) -> list[str]:
    if not args:
        return ["a bare `python`: name a script, -m MODULE or -c CODE"]
    head, rest = args[0], args[1:]
    if head == "-c":
        return _check_code(rest[0]) if rest else ["python -c without code"]
    if head == "-m":
        if not rest:
            return ["python -m without a module"]
        module, rest = rest[0], rest[1:]
        if module == "pytest":
            return _check_pytest(rest)
        source = _module_source(module)
        if source is None:
            return [f"python -m {module}: no such module"]
        return _check_flags(f"python -m {module}", source, rest)
    if head.endswith("main_omni.py"):
        return check_main_omni(rest, static)
    script = ROOT / head
    if not script.is_file():
        return [f"python {head}: no such script"]
    return _check_flags(f"python {head}", script.read_text(), rest)


def _module_source(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    if origin.name == "__init__.py" and (origin.parent / "__main__.py").is_file():
        origin = origin.parent / "__main__.py"
    if not origin.is_file():
        return None
    source = origin.read_text()
    if origin.name == "__main__.py":  # a thin entry point: its flags are declared where its main comes from
        for imported in re.findall(r"^from ([\w.]+) import main\b", source, re.MULTILINE):
            source += _module_source(imported) or ""
    return source


def _check_flags(what: str, source: str, args: list[str]) -> list[str]:
    declared = set(re.findall(r"""["'](--[\w-]+)["']""", source)) | {"--help"}
    problems = []
    for arg in args:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            if flag not in declared:
                problems.append(f"{what}: the flag {flag} is not one the program declares")
    return problems


PYTEST_VALUE_OPTIONS = {"-m", "-k", "-p", "-c", "-o", "--timeout", "--rootdir", "--maxfail"}


def _check_pytest(args: list[str]) -> list[str]:
    problems, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in PYTEST_VALUE_OPTIONS:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        path = arg.split("::", 1)[0]
        if not (ROOT / path).exists():
            problems.append(f"python -m pytest {arg}: {path} does not exist")
    return problems


def _check_code(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return [f"python -c: not valid Python: {err}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                problems += _import_problem(alias.name, None)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                problems += _import_problem(node.module, alias.name)
    return problems


def _import_problem(module: str, name: str | None) -> list[str]:
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        return [f"python -c: cannot import {module}: {err}"]
    if name is not None and not hasattr(mod, name):
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            return [f"python -c: {module} has no {name}"]
    return []


def _check_pip(args: list[str]) -> list[str]:
    if not args or args[0] != "install":
        return [f"pip {' '.join(args)}: only `pip install` is checked"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    problems = []
    for arg in args[1:]:
        match = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
        if match:
            problems += [f"pip install {arg}: pyproject.toml has no extra {name!r}"
                         for name in match[1].split(",") if name not in extras]
    return problems


def _check_docker(args: list[str]) -> list[str]:
    if args[:1] == ["build"]:
        if "-f" in args:
            dockerfile = args[args.index("-f") + 1]
            if not (ROOT / dockerfile).is_file():
                return [f"docker build -f {dockerfile}: no such Dockerfile"]
        return []
    if args[:1] == ["run"]:
        entry = next((i for i, a in enumerate(args) if a.endswith("main_omni.py")), None)
        return [] if entry is None else check_main_omni(args[entry + 1:], static=True)
    return [f"docker {args[:1]}: only docker build and docker run are checked"]


# ------------------------------------------------------------------------------------------
# python main_omni.py
# ------------------------------------------------------------------------------------------


def check_main_omni(args: list[str], static: bool) -> list[str]:
    if "--help" in args or "-h" in args or "--options" in args:
        return _run_cli(args)
    # `--plan`'s device options are checked as the CLI checks them, then dropped with their values.
    if "--plan" in args:
        from omni_rl.cli import _plan_options
        from omni_rl.errors import OmniConfigError

        try:
            args = _plan_options(args, True)[0]
        except OmniConfigError as err:
            return [f"python main_omni.py: {err}"]
        args = [a for a in args if a != "--plan"]
    # The evaluation flags are parsed as the CLI parses them; a named benchmark must be registered.
    args, problems = _eval_flags(args)
    if problems is not None:
        return problems
    # A usage line (`recipe=NAME key=value ...`) names no recipe or key: its placeholders drop out.
    overrides = [a for a in args if a != "--cfg" and a not in ("job", "all", "hydra", "...", "key=value")
                 and not (a.startswith("recipe=") and _placeholder(a))]
    flags = [a for a in overrides if a.startswith("-")]
    if flags:
        return [f"python main_omni.py: unknown flag {flags[0]}"]
    if static:
        return _static_overrides(overrides)
    from omni_rl.cli import DEMO_RECIPE
    from omni_rl.compose import load_config
    from omni_rl.errors import ConfigError

    if not any(a.startswith("recipe=") for a in overrides):
        overrides = [f"recipe={DEMO_RECIPE}", *overrides]
    try:
        load_config(overrides)
    except ConfigError as err:
        return [f"python main_omni.py {' '.join(args)}: {err}"]
    return []


def _eval_flags(args: list[str]) -> tuple[list[str], list[str] | None]:
    """(the arguments left, None) when the evaluation flags are fine so far, else (_, problems):
    a bad flag or an unknown benchmark; `--compare` has nothing more to check ([])."""
    from omni_rl.errors import OmniConfigError
    from omni_rl.eval.cli_args import take_eval_args

    try:
        rest, request, compare = take_eval_args(args)
    except OmniConfigError as err:
        return args, [f"python main_omni.py: {err}"]
    if compare is not None:
        return args, []
    if request is not None:
        from omni_rl.eval import benchmarks  # noqa: F401  (the built-in benchmarks)
        from omni_rl.eval.benchmark import BENCHMARKS
        from omni_rl.plugins import load_plugins

        load_plugins(())
        try:
            BENCHMARKS.get(request.benchmark)
        except OmniConfigError as err:
            return args, [f"python main_omni.py --eval {request.benchmark}: {err}"]
    return rest, None


def _run_cli(args: list[str]) -> list[str]:
    import contextlib
    import io

    from omni_rl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    if code != 0:
        return [f"python main_omni.py {' '.join(args)}: exit {code}: {err.getvalue().strip()[:300]}"]
    return []


def _static_overrides(overrides: list[str]) -> list[str]:
    """A marked command's overrides, checked without composing: the recipe exists and every key
    is a field of the schema (a dict-typed field takes any key below it)."""
    from omni_rl.config import OmniConfig, available_recipes

    problems = []
    for override in overrides:
        if "=" not in override:
            problems.append(f"{override!r} is not key=value")
            continue
        key, value = override.split("=", 1)
        if key == "recipe":
            if not _placeholder(value) and value not in available_recipes() and not (ROOT / value).is_file():
                problems.append(f"recipe={value}: no such recipe")
            continue
        tp = OmniConfig
        for part in key.lstrip("+~").split("."):
            if not is_dataclass(tp):
                break  # a dict or list field: its keys are the component's
            hints = typing.get_type_hints(tp)
            if part not in hints:
                problems.append(f"{key}: the schema has no key {part!r} here")
                break
            tp = _unwrap(hints[part])
    return problems


def _unwrap(annotation) -> object:
    """Optional[X] -> X; anything else as it is."""
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else dict
    return annotation
