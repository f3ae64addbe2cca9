"""Final answers read out of model text: the last `\\boxed{}` (`last_boxed`), and the final answer of a
solution (`extract_answer`: the last `\\boxed{}` or `\\fbox{}`, else the last `<answer>` tag, else
"the answer is ...").

One brace matcher serves every caller, so they agree on what a box is: braces nest (escaped `\\{` and `\\}`
count as braces too), "last" means the box that opens last, so of nested boxes the inner one wins, and a box
whose braces never close gives way to the last closed one before it. The Solver's parser
(`sage.engines.text.tags.parse_solver`) falls back on `\\boxed{}` only, kept as written; `extract_answer`,
used by the verify and evaluate stages before the math checker decides equivalence, also takes `\\fbox{}`
and returns what is inside. Nothing here raises on model output.
"""

from __future__ import annotations

import re

#: Box commands `last_boxed` looks for by default, and those `extract_answer` takes.
BOXED = ("\\boxed",)
BOXED_OR_FBOX = ("\\boxed", "\\fbox")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_IS = re.compile(r"the (?:final )?answer is[:\s]*(.+)", re.I)


def last_boxed(text: str, commands: tuple[str, ...] = BOXED) -> str | None:
    """The last `\\boxed{...}` (or box of any of `commands`) whose braces balance, as written, command
    included; None when there is none. One pass over `text`."""
    openers = tuple(c + "{" for c in commands)
    stack: list[int] = []   # start of each open brace: where its box command starts, or -1 for a plain brace
    best: tuple[int, int] | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            opener = next((o for o in openers if text.startswith(o, i)), None)
            if opener is not None:
                stack.append(i)
                i += len(opener)
                continue
        elif c == "{":
            stack.append(-1)
        elif c == "}" and stack:
            begin = stack.pop()
            if begin >= 0 and (best is None or begin > best[0]):
                best = (begin, i + 1)
        i += 1
    return text[best[0]:best[1]] if best else None


def _boxed_content(text: str) -> str | None:
    """What the last `\\boxed{}` or `\\fbox{}` of `text` holds, stripped ("" for an empty box), or None."""
    box = last_boxed(text, BOXED_OR_FBOX)
    return None if box is None else box[box.index("{") + 1:-1].strip()


def extract_answer(text: str | None) -> str | None:
    """The final answer: last `\\boxed{}` (or `\\fbox{}`), else the last `<answer>` tag (a box inside it
    preferred), else "the answer is ..." up to the end of its line, without `$` and a final period."""
    if not text:
        return None
    boxed = _boxed_content(text)
    if boxed:
        return boxed
    tags = _ANSWER_TAG.findall(text)
    if tags and tags[-1].strip():
        inner = tags[-1].strip()
        return _boxed_content(inner) or inner
    found = _ANSWER_IS.findall(text)
    if found:
        lines = found[-1].strip().splitlines()  # none when only spaces follow "the answer is"
        line = re.sub(r"^\$+|\$+$", "", lines[0].strip().rstrip(". ")).strip() if lines else ""
        return line or None
    return None
