"""The ``streamrank`` commands the documents show, found and parsed as the CLI would parse them.

Documents: README.md, every page of docs/, BENCHMARKS.md and RELIABILITY.md. A command is
found in a fenced or indented code block (a line, with ``\\`` continuations) or in an inline
code span,
after any ``VAR=value`` assignments; it ends at a shell operator (``&&``, ``|``, ``>``...).
A *concrete* command (every word a real value) is parsed by the CLI's own parser, without
running it. A *synopsis* (``[--events N]``, ``VERSION``, ``list|promote``) is checked for its
command and its option names only.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import typer.core
import typer.main

from pipeline.cli import app

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = sorted(
    [
        REPO_ROOT / "README.md",
        REPO_ROOT / "BENCHMARKS.md",
        REPO_ROOT / "RELIABILITY.md",
        *(REPO_ROOT / "docs").glob("*.md"),
    ]
)
SHELL_OPERATORS = {"&&", "||", "|", ";", ">", ">>", "<", "2>&1", "&"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(:[A-Z]+)?(\.[a-z]+)?$")  # N, VERSION, HOST:PORT, F.png
ENTRY_POINT = re.compile(r"(^|/)streamrank$")


@dataclass(frozen=True)
class DocumentedCommand:
    """One ``streamrank`` command as a document shows it."""

    where: str
    """``README.md:42``."""
    words: tuple[str, ...]
    """The words after ``streamrank``."""

    @property
    def is_synopsis(self) -> bool:
        """Placeholders or alternatives instead of values."""
        return any(
            PLACEHOLDER.match(w) or any(c in w for c in "[]|<>$") or "..." in w for w in self.words
        )

    def __str__(self) -> str:
        return f"{self.where}: streamrank {' '.join(self.words)}"


def _shell_words(text: str) -> list[str] | None:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: not a shell line
        return None


def _command_words(words: list[str]) -> tuple[str, ...] | None:
    """The words after the entry point (``streamrank``, ``.venv/bin/streamrank``, or the
    compose scorer's ``--no-deps scorer``), up to a shell operator; ``None`` without one."""
    for i, word in enumerate(words):
        docker_scorer = word == "scorer" and i > 0 and words[i - 1] == "--no-deps"
        if ENTRY_POINT.search(word) or docker_scorer:
            rest: list[str] = []
            for w in words[i + 1 :]:
                if w in SHELL_OPERATORS or w.startswith((">", "2>")):
                    break
                rest.append(w)
            return tuple(rest)
    return None


def _code_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of shell lines in fenced blocks (continuations joined) and of inline
    code spans elsewhere."""
    in_fence = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence or (line.startswith("    ") and "`" not in line):
            start, joined = pending or (number, "")
            joined += " " + line.strip()
            if joined.endswith("\\"):
                pending = (start, joined[:-1])
                continue
            pending = None
            yield start, joined
        else:
            for span in re.findall(r"`([^`\n]+)`", line):
                yield number, span


def documented_commands() -> list[DocumentedCommand]:
    """Every ``streamrank`` command shown in the documents."""
    found: list[DocumentedCommand] = []
    for document in DOCUMENTS:
        name = document.relative_to(REPO_ROOT).as_posix()
        for number, line in _code_lines(document.read_text()):
            if "streamrank" not in line and "scorer" not in line:
                continue
            words = _shell_words(line)
            command = _command_words(words) if words else None
            if command:  # not the bare program name
                found.append(DocumentedCommand(f"{name}:{number}", command))
    return found


@functools.cache
def _root() -> typer.core.TyperGroup:
    """The app's click group, built once (typer builds it anew at each call: 0.1-0.5 s, which
    the 240 documented-command checks paid several times each)."""
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    return root


@functools.cache
def cli_commands() -> dict[str, typer.core.TyperCommand]:
    """Every command of the ``streamrank`` app, by its name (``"bench model"``); read only."""
    root = _root()
    found: dict[str, typer.core.TyperCommand] = {}
    for name, command in root.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            found.update({f"{name} {sub}": c for sub, c in command.commands.items()})
        else:
            found[name] = command
    return found


def _global_options() -> dict[str, bool]:
    """The app's own options (before the command): ``{"--config": takes a value, ...}``."""
    root = _root()
    return {
        opt: not getattr(param, "is_flag", False) for param in root.params for opt in param.opts
    }


def _split(words: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(global option words, the rest)."""
    options, i = _global_options(), 0
    while i < len(words) and words[i].split("=")[0] in options:
        takes_value = options[words[i].split("=")[0]] and "=" not in words[i]
        i += 2 if takes_value else 1
    return list(words[:i]), list(words[i:])


def _groups() -> set[str]:
    root = _root()
    return {n for n, c in root.commands.items() if isinstance(c, typer.core.TyperGroup)}


def resolve(command: DocumentedCommand) -> tuple[list[str], list[str]]:
    """The command names it may mean (``model list|promote`` gives two) and its other words.

    ``streamrank --help`` names no command; nor do ``streamrank bench`` (a group) and
    ``streamrank ...`` (any command), which prose uses to mention a set of commands.

    Raises:
        AssertionError: no such command.
    """
    _, rest = _split(command.words)
    if not rest or rest[0].startswith("-") or rest[0] == "...":
        return [], rest
    if rest[0] in _groups() and (len(rest) == 1 or rest[1] == "..."):
        return [], rest[1:]
    known = cli_commands()
    for length in (2, 1):
        head = rest[:length]
        alternatives = [" ".join([*head[:-1], alt]) for alt in head[-1].split("|")]
        if len(head) == length and all(name in known for name in alternatives):
            return alternatives, rest[length:]
    raise AssertionError(f"{command}: no such command")


def is_mention(command: DocumentedCommand) -> bool:
    """A synopsis (``[--events N]``, ``VERSION``, ``list|promote``), or prose naming an option
    without its value (``streamrank produce --rate``): checked for names only."""
    if command.is_synopsis:
        return True
    names, rest = resolve(command)
    if not names or not rest or not rest[-1].startswith("--"):
        return not names and bool(command.words)
    takes_value = {
        opt
        for param in cli_commands()[names[0]].params
        if not getattr(param, "is_flag", False)
        for opt in param.opts
    }
    return rest[-1] in takes_value


def check_options(command: DocumentedCommand) -> None:
    """Its command exists and every ``--option`` it shows is one of that command's."""
    global_words, _ = _split(command.words)
    unknown_global = {w for w in global_words if w.startswith("-")} - set(_global_options())
    assert not unknown_global, f"{command}: unknown {unknown_global}"
    names, rest = resolve(command)
    known = cli_commands()
    shown = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", " ".join(rest)))
    for name in names:
        options = {opt for param in known[name].params for opt in param.opts}
        assert shown <= options | {"--help"}, f"{command}: `{name}` has no {shown - options}"


def parse(command: DocumentedCommand) -> None:
    """Parse a concrete command with the CLI's own parser (nothing runs).

    Raises:
        AssertionError: a word the command would refuse.
    """
    check_options(command)
    names, rest = resolve(command)
    for name in names:
        try:
            cli_commands()[name].make_context(name, list(rest))
        except Exception as error:
            if type(error).__name__ == "Exit":  # --help
                continue
            raise AssertionError(f"{command}: {type(error).__name__}: {error}") from error
