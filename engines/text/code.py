"""Python code and test inputs read out of model text: fenced blocks, the entry point's name, syntax errors,
and Challenger test inputs (one JSON array of arguments per line, leniently). Used by the role parsers in
`sage.engines.text.tags`; nothing here raises on model output.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

MAX_INPUTS = 64          # test inputs kept from one Challenger output
MAX_INPUT_LINE = 4000    # characters; longer lines are recorded as errors, never parsed

_FENCE_RX = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\r?\n(.*?)```", re.DOTALL)
_FENCE_OPEN_RX = re.compile(r"```[ \t]*[A-Za-z0-9_+.-]*[ \t]*\r?\n")
_DEF_RX = re.compile(r"\bdef\s+([A-Za-z_]\w*)\s*\(")
_TOP_DEF_RX = re.compile(r"^(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def code_from(text: str | None, which: str = "last") -> str | None:
    """Python source from `text`: the first/last fenced block, an unclosed fence's rest, else the text
    itself with stray fence lines removed. None for None or blank."""
    if text is None:
        return None
    blocks = [m.group(2) for m in _FENCE_RX.finditer(text)]
    if blocks:
        code = blocks[0] if which == "first" else blocks[-1]
    else:
        m = _FENCE_OPEN_RX.search(text)
        code = text[m.end():] if m else text
        code = code.replace("```", "")
    code = code.strip("\n").rstrip()
    return code if code.strip() else None


def last_fenced(text: str) -> str | None:
    blocks = [m.group(2) for m in _FENCE_RX.finditer(text)]
    if not blocks:
        return None
    code = blocks[-1].strip("\n").rstrip()
    return code or None


def syntax_error(code: str | None) -> str | None:
    if code is None:
        return "no code"
    try:
        ast.parse(code)
    except SyntaxError as e:
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    except Exception as e:  # ValueError (null bytes), RecursionError, MemoryError
        return f"{type(e).__name__}: {e}"
    return None


def entry_point(signature: str | None, solution: str | None) -> str | None:
    """Function name from the signature, else the solution's first top-level def."""
    if signature:
        m = _DEF_RX.search(signature)
        if m:
            return m.group(1)
    if not solution:
        return None
    try:
        for node in ast.parse(solution).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
    except Exception:  # unparseable code: fall back to the text
        pass
    m = _TOP_DEF_RX.search(solution)
    return m.group(1) if m else None


def _json_value(s: str) -> Any:
    """JSON, else a Python literal turned into JSON data (tuples become lists); raises when neither."""
    try:
        return json.loads(s)
    except ValueError:
        pass
    value = ast.literal_eval(s)
    return json.loads(json.dumps(value))


def parse_inputs(content: str | None) -> tuple[list[list[Any]], list[str]]:
    """Test inputs as lists of positional arguments, plus the errors of lines that did not parse.

    Preferred form: one JSON array of arguments per line (`[1, 2]` is f(1, 2)). Also read: one JSON array
    of such arrays spread over several lines, a bare value on a line (one argument), Python literals."""
    if content is None:
        return [], []
    body = code_from(content, "first") or ""
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
    if len(lines) > 1:
        try:
            whole = json.loads(body)
        except ValueError:
            whole = None
        if isinstance(whole, list) and whole and all(isinstance(a, list) for a in whole):
            if not all(_is_json_list(ln) for ln in lines):
                lines = [json.dumps(a) for a in whole]
    inputs: list[list[Any]] = []
    errors: list[str] = []
    for n, line in enumerate(lines, 1):
        if len(inputs) >= MAX_INPUTS:
            errors.append(f"more than {MAX_INPUTS} inputs; kept the first {MAX_INPUTS}")
            break
        if len(line) > MAX_INPUT_LINE:
            errors.append(f"line {n}: longer than {MAX_INPUT_LINE} characters")
            continue
        try:
            value = _json_value(line)
        except Exception:  # not JSON nor a literal: try it as an argument list
            try:
                value = _json_value(f"[{line}]")
            except Exception as e:
                errors.append(f"line {n}: not a JSON array ({type(e).__name__}): {line[:80]}")
                continue
        inputs.append(value if isinstance(value, list) else [value])
    return inputs, errors


def _is_json_list(line: str) -> bool:
    try:
        return isinstance(json.loads(line), list)
    except ValueError:
        return False
