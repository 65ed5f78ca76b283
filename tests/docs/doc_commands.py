"""Find the ``recover`` commands the documentation shows, and check each against the CLI.

A documented command is any line of a fenced code block, or any inline code span, that starts
with ``recover`` (optionally behind ``$ `` or ``.venv/bin/``). Synopsis notation is understood:
``[...]`` optional parts, ``A | B`` alternatives (``B`` is a sibling command of ``A``'s last
word, or of one of its parents), indented or ``\\``-continued lines, ``#`` comments, and
``-- COMMAND`` (the rest is a separate command). Every sub-command word must exist and every
``--option`` must belong to the command it follows, so a renamed command or option fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"`((?:\.venv/bin/)?recover [^`]+)`")
_START = re.compile(r"^\s*(?:\$\s+)?(?:\S*/)?recover(?:\s|$)")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


@dataclass(frozen=True)
class DocCommand:
    """One command as the docs show it: the file, the line number and the text."""

    path: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _strip_comment(line: str) -> str:
    # A '#' preceded by whitespace starts a shell comment (not inside '#'-free option values).
    return re.split(r"\s#", line, maxsplit=1)[0].rstrip()


def commands_in(path: Path) -> Iterator[DocCommand]:
    """Every documented ``recover`` command in one markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    in_block = False
    current: DocCommand | None = None
    for number, raw in enumerate(lines, start=1):
        if _FENCE.match(raw):
            if current is not None:
                yield current
                current = None
            in_block = not in_block
            continue
        if not in_block:
            for m in _INLINE.finditer(raw):
                yield DocCommand(path, number, m.group(1))
            continue
        line = _strip_comment(raw)
        continues = current is not None and (
            current.text.endswith("\\")
            or (line.startswith((" ", "\t")) and line.strip()[:1] in "[-|")
        )
        if continues and current is not None:
            current = DocCommand(
                path, current.line, current.text.rstrip("\\ ") + " " + line.strip()
            )
            continue
        if current is not None:
            yield current
            current = None
        if _START.match(line):
            current = DocCommand(path, number, line.strip().removeprefix("$").strip())
    if current is not None:
        yield current


def all_commands() -> list[DocCommand]:
    return [c for path in DOCS for c in commands_in(path)]


def _words(text: str) -> list[str]:
    # Optional parts and placeholders do not name commands; options are checked separately.
    return [w for w in re.split(r"[\s\[\]{}()]+", text) if w]


# Commands are typer's (which carries its own copy of click): read by shape, not by class.
Cmd = Any


def _is_group(cmd: Cmd) -> bool:
    return isinstance(getattr(cmd, "commands", None), dict)


def _child(group: Cmd, name: str) -> Cmd | None:
    return group.commands.get(name) if _is_group(group) else None


def _options(cmd: Cmd) -> set[str]:
    found = {"--help"}
    for p in cmd.params:
        found.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return found


def _check_part(root: Cmd, chain: list[Cmd], part: str, first: bool) -> tuple[list[Cmd], list[str]]:
    """Resolve one alternative of a synopsis line; returns the command chain and problems."""
    words = _words(part)
    problems: list[str] = []
    if first:
        words = words[1:]  # 'recover'
        chain = [root]
    elif words and words[0].startswith("-"):
        pass  # '--kubeconfig F | --in-cluster': more options of the same command
    elif words:
        # A sibling: look for the word among the children of the chain's groups, nearest first.
        for depth in range(len(chain) - 1, -1, -1):
            if _child(chain[depth], words[0]) is not None:
                chain = chain[: depth + 1]
                break
        else:
            return chain, [
                f"'{words[0]}' is no sub-command near {' '.join(c.name or '' for c in chain)}"
            ]
    for w in words:
        if w.startswith("-"):
            break
        if "|" in w and _is_group(chain[-1]):  # 'up|down|status': each one a sub-command
            missing = [x for x in w.split("|") if _child(chain[-1], x) is None]
            problems += [f"no sub-command '{x}' of '{chain[-1].name}'" for x in missing]
            break
        nxt = _child(chain[-1], w)
        if nxt is None:
            if _is_group(chain[-1]):
                known = ", ".join(sorted(chain[-1].commands))
                problems.append(f"no sub-command '{w}' of '{chain[-1].name}' (known: {known})")
            break  # an argument or placeholder: the command is resolved
        chain = [*chain, nxt]
    leaf = chain[-1]
    if _is_group(leaf) and not any(w.startswith("--") for w in words):
        return chain, problems  # a group named alone ('recover cluster'): fine
    extra_ok = bool(leaf.context_settings.get("ignore_unknown_options"))
    if not extra_ok:
        known_opts = _options(leaf)
        for opt in _OPTION.findall(part):
            if opt not in known_opts:
                problems.append(
                    f"'{leaf.name}' has no option {opt} (known: {', '.join(sorted(known_opts))})"
                )
    return chain, problems


def _alternatives(text: str) -> list[str]:
    # ' | ' outside brackets separates commands; inside ('[--resume | --auto-resume]') options.
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "[{("
        depth -= ch in "]})"
        if ch == "|" and depth == 0 and text[i - 1 : i + 2] == " | ":
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def check(cmd: DocCommand, root: Cmd) -> list[str]:
    """Problems with one documented command; empty when the CLI accepts its shape."""
    text, _, rest = cmd.text.partition(" -- ")
    problems: list[str] = []
    chain: list[Cmd] = [root]
    for i, part in enumerate(_alternatives(text)):
        chain, found = _check_part(root, chain, part, first=(i == 0))
        problems += found
    rest = rest.strip()
    if _START.match(rest):
        problems += check(DocCommand(cmd.path, cmd.line, rest), root)
    return problems
