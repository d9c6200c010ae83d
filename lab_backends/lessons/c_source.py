"""Read C backends (and model.py files) the way a reviewer does: one whole function at a time.

Why: a lesson that greps single lines out of ``scale.c`` shows *that* a call exists, not the path
that leads to it; an entry point read whole, with its line numbers, does. The same parser backs a
small static check of the one ownership rule C backends most often get wrong: after
``TRITONBACKEND_ResponseSend`` the response belongs to Triton, even when the call returned an
error, so deleting it afterwards is a double free (tests run it over every C source we ship, and
the C exercise's checker runs it over the learner's file).

The C side is deliberately small: comments and string literals are blanked (lengths and newlines
kept), then top-level ``name(...) {...}`` blocks are matched by brace depth. That is enough for
backend sources written in ordinary C; it is not a C parser.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from lab_backends.errors import LabBackendsError

_COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_DEFINITION_START = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
#: Calls after which the response passed as first argument is Triton's (ours: lab_send_error).
SENDING_CALLS = ("TRITONBACKEND_ResponseSend", "lab_send_error")


@dataclass(frozen=True)
class Function:
    """One function of a source file: its name and 1-based first/last lines (comment above included)."""

    name: str
    first: int
    last: int
    text: str  # the lines first..last of the original file
    code: str  # the same span with comments and strings blanked (for checks)


def _blank(match: re.Match) -> str:
    return "".join(c if c == "\n" else " " for c in match.group(0))


def strip_comments(source: str) -> str:
    """The source with comments and string/char literals blanked out, same length, same lines."""
    return _COMMENT_OR_STRING.sub(_blank, source)


def _matching_brace(code: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise LabBackendsError("unbalanced braces: the source does not compile as it is")


def c_functions(source: str) -> list[Function]:
    """Every function *defined* at top level of a C source, in file order."""
    code = strip_comments(source)
    lines = source.splitlines()
    found: list[Function] = []
    pos, depth_zero_from = 0, 0
    while True:
        match = _DEFINITION_START.search(code, pos)
        if match is None:
            return found
        # What follows the parameter list at paren depth 0: '{' for a definition, else not one.
        i, parens = match.end() - 1, 0
        while i < len(code):
            parens += {"(": 1, ")": -1}.get(code[i], 0)
            if parens == 0:
                break
            i += 1
        rest = code[i + 1:]
        after = len(rest) - len(rest.lstrip())
        at_top = code[depth_zero_from:match.start()].count("{") == code[depth_zero_from:match.start()].count("}")
        if at_top and i + 1 + after < len(code) and code[i + 1 + after] == "{" and match.group(1) not in (
                "if", "for", "while", "switch"):
            end = _matching_brace(code, i + 1 + after)
            first = code.count("\n", 0, match.start()) + 1
            # Pull in the return type on earlier lines and the comment block right above.
            while first > 1 and lines[first - 2].strip() and not lines[first - 2].rstrip().endswith((";", "}")):
                first -= 1
            last = code.count("\n", 0, end) + 1
            code_lines = code.splitlines()
            found.append(Function(match.group(1), first, last, "\n".join(lines[first - 1:last]),
                                  "\n".join(code_lines[first - 1:last])))
            pos = depth_zero_from = end + 1
        else:
            pos = match.end()


def python_functions(source: str) -> list[Function]:
    """Every function and method of a Python source (``Class.method`` for methods)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                text = "\n".join(lines[first - 1:child.end_lineno])
                found.append(Function(prefix + child.name, first, child.end_lineno or first, text, text))
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def function(path: str | Path, name: str) -> Function:
    """Function ``name`` of a ``.c``/``.h`` or ``.py`` file, or an error listing the ones there are."""
    path = Path(path)
    if not path.is_file():
        raise LabBackendsError(f"{path} does not exist: give the path of a .c, .h or .py file")
    source = path.read_text()
    functions = python_functions(source) if path.suffix == ".py" else c_functions(source)
    for f in functions:
        if f.name == name:
            return f
    raise LabBackendsError(
        f"{path.name} defines no function {name!r}; it defines: {', '.join(f.name for f in functions)}")


def show(path: str | Path, name: str) -> Function:
    """Print function ``name`` of ``path`` whole, each line with its number; return it."""
    f = function(path, name)
    print(f"{Path(path).name}:{f.first}-{f.last}")
    for number, line in enumerate(f.text.splitlines(), f.first):
        print(f"{number:4d}  {line}")
    return f


def _first_argument(code: str, open_paren: int) -> str:
    depth, i = 0, open_paren
    while i < len(code):
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth == 0:
                break
        elif c == "," and depth == 1:
            break
        i += 1
    return re.sub(r"\s+", "", code[open_paren + 1:i])


def responses_deleted_after_send(source: str) -> list[str]:
    """Where a function deletes a response it already handed to a sending call.

    One entry per offence, e.g. ``"Execute: TRITONBACKEND_ResponseDelete(response) after
    TRITONBACKEND_ResponseSend(response) (line 97)"``; empty when the rule holds.
    """
    problems = []
    for f in c_functions(source):
        sends: dict[str, tuple[str, int]] = {}
        events = sorted(
            [(m.start(), "send", m) for call in SENDING_CALLS for m in re.finditer(rf"\b{call}\s*\(", f.code)]
            + [(m.start(), "delete", m) for m in re.finditer(r"\bTRITONBACKEND_ResponseDelete\s*\(", f.code)],
            key=lambda event: event[0])
        for start, kind, m in events:
            target = _first_argument(f.code, m.end() - 1)
            if kind == "send":
                sends[target] = (m.group(0).rstrip("( "), start)
            elif target in sends:
                line = f.first + f.code.count("\n", 0, start)
                problems.append(f"{f.name}: TRITONBACKEND_ResponseDelete({target}) after "
                                f"{sends[target][0]}({target}) (line {line})")
    return problems


def _block_after(code: str, pos: int) -> tuple[int, int] | None:
    """(start, end) of the ``{...}`` block or single statement that follows position ``pos``."""
    rest = code[pos:]
    stripped = len(rest) - len(rest.lstrip())
    start = pos + stripped
    if start < len(code) and code[start] == "{":
        return start, _matching_brace(code, start)
    end = code.find(";", start)
    return (start, end) if end >= 0 else None


def _frees(code: str, call: str, target: str, helpers: set[str]) -> bool:
    """Does ``code`` call ``call(target)``, or a helper of this file that does, with ``target``?"""
    names = "|".join(re.escape(n) for n in sorted({call} | helpers))
    return any(_first_argument(code, m.end() - 1) == target for m in re.finditer(rf"\b(?:{names})\s*\(", code))


def _helpers_calling(functions: list[Function], call: str) -> set[str]:
    """Functions of the file that call ``call`` on their first parameter (e.g. a log-and-free helper)."""
    found = set()
    for f in functions:
        params = re.search(rf"\b{re.escape(f.name)}\s*\(([^)]*)\)", f.code)
        if params is None:
            continue
        first = re.findall(r"[A-Za-z_]\w*", params.group(1).split(",")[0])
        if first and _frees(f.code, call, first[-1], set()):
            found.add(f.name)
    return found


def send_errors_leaked(source: str) -> list[str]:
    """Where the error a failed ``TRITONBACKEND_ResponseSend`` returned is not freed.

    The error object is the caller's to delete (core ``include/triton/core/tritonserver.h`` at r24.10,
    319-320: "The caller takes ownership of a TRITONSERVER_Error object returned by the API"); the
    response, in contrast, is Triton's after the send, failed or not (``tritonbackend.h`` 757-759). The
    check reads each ``err = TRITONBACKEND_ResponseSend(...)`` followed by ``if (err ...)``: the
    block must pass ``err`` to ``TRITONSERVER_ErrorDelete`` (or to a helper of this file that does).
    """
    functions = c_functions(source)
    helpers = _helpers_calling(functions, "TRITONSERVER_ErrorDelete")
    problems = []
    for f in functions:
        for m in re.finditer(r"\b([A-Za-z_]\w*)\s*=\s*TRITONBACKEND_ResponseSend\s*\(", f.code):
            target = m.group(1)
            branch = re.compile(rf"\bif\s*\(\s*{re.escape(target)}\s*(?:!=\s*NULL\s*)?\)").search(f.code, m.end())
            line = f.first + f.code.count("\n", 0, m.start())
            if branch is None:
                problems.append(f"{f.name}: the error of TRITONBACKEND_ResponseSend (line {line}) is never tested")
                continue
            block = _block_after(f.code, branch.end())
            if block is None or not _frees(f.code[block[0]:block[1] + 1], "TRITONSERVER_ErrorDelete", target, helpers):
                problems.append(f"{f.name}: when TRITONBACKEND_ResponseSend fails (line {line}), {target} is never "
                                f"passed to TRITONSERVER_ErrorDelete")
    return problems


def finalize_frees_state(source: str, finalizer: str = "TRITONBACKEND_ModelFinalize") -> bool:
    """Does ``finalizer`` free what it gets from ``TRITONBACKEND_ModelState`` (``free()``, directly or
    through a helper of this file)? False when it is missing or frees nothing."""
    functions = c_functions(source)
    body = next((f.code for f in functions if f.name == finalizer), None)
    if body is None:
        return False
    helpers = _helpers_calling(functions, "free")
    names = "|".join(re.escape(n) for n in sorted({"free"} | helpers))
    return "TRITONBACKEND_ModelState" in body and re.search(rf"\b(?:{names})\s*\(", body) is not None
