"""What a fix-up's install script (postInstall, preFixup, ... as Nix evaluated it) does to the
files of its wheel, for the audit: the `substituteInPlace FILE --replace-fail OLD NEW` edits and
the `rm -f` removals.

Only the shell the fix-ups use is understood: one command per line (backslash continuations,
quoted strings across lines),
`name=value` assignments, and `$name` / `${name}` expansion. A line it cannot split is skipped,
never guessed.
"""

import re
import shlex
from dataclasses import dataclass

_VAR = re.compile(r"\$(\w+)|\$\{(\w+)\}")
_ASSIGN = re.compile(r"^(\w+)=(\S+)$")


@dataclass(frozen=True)
class Replacement:
    path: str  # as written after expansion, e.g. $out/lib/python3.12/site-packages/x.py
    old: str
    new: str
    must_match: bool  # --replace-fail (nixpkgs fails the build) versus --replace-warn/quiet


@dataclass(frozen=True)
class Effects:
    replacements: tuple[Replacement, ...]
    removed: tuple[str, ...]  # rm -f arguments (may be globs), expanded


def _command_lines(script: str) -> list[str]:
    """The script cut at newlines outside quotes: a quoted multi-line OLD/NEW stays one command."""
    out, buf, quote, escaped = [], [], None, False
    for ch in re.sub(r"\\\n", " ", script):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "\n":
            out.append("".join(buf))
            buf = []
            continue
        buf.append(ch)
    out.append("".join(buf))
    return out


def _commands(script: str) -> list[list[str]]:
    out = []
    for line in _command_lines(script):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words:
            out.append(words)
    return out


def effects(script: str) -> Effects:
    variables = {"out": "$out"}
    replacements, removed = [], []

    def expand(word: str) -> str:
        return _VAR.sub(lambda m: variables.get(m[1] or m[2], m[0]), word)

    for words in _commands(script):
        if len(words) == 1 and (m := _ASSIGN.match(words[0])):
            variables[m[1]] = expand(m[2])
        elif words[0] == "substituteInPlace" and len(words) > 1:
            paths, i = [], 1
            while i < len(words) and not words[i].startswith("--"):
                paths.append(expand(words[i]))
                i += 1
            while i + 2 < len(words) and words[i].startswith("--replace"):
                old, new = words[i + 1], words[i + 2]
                for path in paths:
                    replacements.append(Replacement(path, old, new, words[i] == "--replace-fail"))
                i += 3
        elif words[0] == "rm":
            removed += [expand(w) for w in words[1:] if not w.startswith("-")]
    return Effects(tuple(replacements), tuple(removed))
