"""Final answers read out of model text: the last `\\boxed{}` (`last_boxed`), and the final answer of a
solution (`extract_answer`: the last `\\boxed{}` or `\\fbox{}`, else the last `<answer>` tag, else
"the answer is ...").

One brace matcher serves every caller, so they agree on what a box is: braces nest (escaped `\\{` and `\\}`
count as braces too), "last" means the box that opens last, so of nested boxes the inner one wins, and a box
whose braces never close gives way to the last closed one before it. The Solver's parser
(`sage.engines.text.tags.parse_solver`) falls back on `\\boxed{}` only, kept as written; `extract_answer`,
used by the verify and evaluate stages before the math checker decides equivalence, also takes `\\fbox{}`
and returns what is inside. A box repeated (`\\boxed{5} ... \\boxed{5}`) counts once, and boxes listed
one after another (`\\boxed{3} and \\boxed{4}`, `\\boxed{-1}, \\boxed{1}`) are one answer, `3, 4`, as
math-verify reads them; boxes with words between them (`\\boxed{3}, no: \\boxed{4}`) leave the last.
A solution with no box, tag or "the answer is" is the math checker's to read (it finds an answer in prose
the way math-verify does). Nothing here raises on model output.

A final answer that negates or hedges a value, or names another in a remark, is no answer (`hedged`): `not 3`,
`anything but 3`, `4, not 3`, `3, not 4`, `at least 3`, `\\geq 3`, `It is 4 (I first thought 3)`. math-verify
would read one value out of each, so a Solver paid for them would learn to write two candidates; the math
checker scores such a prediction 0 unless the reference hedges too.
"""

from __future__ import annotations

import bisect
import re

#: Box commands `last_boxed` looks for by default, and those `extract_answer` takes.
BOXED = ("\\boxed",)
BOXED_OR_FBOX = ("\\boxed", "\\fbox")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_IS = re.compile(r"the (?:final )?answer is[:\s]*(.+)", re.I)


def _closed_boxes(text: str, commands: tuple[str, ...]) -> list[tuple[int, int]]:
    """(start, end) of every box of `commands` whose braces balance, in the order they close. One pass."""
    openers = tuple(c + "{" for c in commands)
    stack: list[int] = []   # start of each open brace: where its box command starts, or -1 for a plain brace
    boxes: list[tuple[int, int]] = []
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
            if begin >= 0:
                boxes.append((begin, i + 1))
        i += 1
    return boxes


def last_boxed(text: str, commands: tuple[str, ...] = BOXED) -> str | None:
    """The last `\\boxed{...}` (or box of any of `commands`) whose braces balance, as written, command
    included; None when there is none. One pass over `text`."""
    boxes = _closed_boxes(text, commands)
    if not boxes:
        return None
    begin, end = max(boxes)
    return text[begin:end]


#: What may stand between boxes that list one answer: spaces, commas, semicolons, "and", "or", math delimiters
#: (`$`, `\\(`, `\\)`), `\\quad`, and the name of what the next box holds (`x = \\boxed{2} or x = \\boxed{5}`).
_LIST_GAP = re.compile(r"(?:\s|[,;$]|\\[()]|\band\b|\bor\b|\\q?quad|\\text\{\s*(?:and|or)\s*\}"
                       r"|(?<![A-Za-z])[A-Za-z](?:_\{?\w+\}?)?\s*=)*")


def _inside(text: str, box: tuple[int, int]) -> str:
    begin, end = box
    return text[text.index("{", begin) + 1:end - 1].strip()


def _boxed_content(text: str) -> str | None:
    """What the last `\\boxed{}` or `\\fbox{}` of `text` holds, stripped ("" for an empty box), or None;
    with the boxes listed right before it, all of them joined by ", ", each once."""
    boxes = _closed_boxes(text, BOXED_OR_FBOX)  # in closing order, so their ends ascend
    if not boxes:
        return None
    ends = [end for _, end in boxes]
    box = max(boxes)
    answers = [_inside(text, box)]  # last first
    while answers[0]:
        k = bisect.bisect_right(ends, box[0]) - 1  # the box that closes last before this one opens
        if k < 0 or not _LIST_GAP.fullmatch(text, boxes[k][1], box[0]):
            break
        box, inside = boxes[k], _inside(text, boxes[k])
        if not inside:
            break
        if inside != answers[-1]:
            answers.append(inside)
    return ", ".join(reversed(answers))


# Words that negate or bound the value they stand by. "no" and "but" negate only right before a value ("No, 3",
# "anything but 3"); elsewhere they join clauses ("720 arrangements, but half are repeats, so 360").
_VALUE = r"(?=\s*[-+$\\(\[{\d])"
_HEDGES = re.compile(
    r"(?i)\b(?:not|never|neither|nor|except|cannot|maybe|perhaps|possibly|probably|either)\b|n't\b"
    r"|\b(?:at\s+(?:least|most)|up\s+to|(?:more|less|fewer|greater|smaller|larger|higher|lower|other)\s+than"
    r"|or\s+(?:more|less|fewer|greater|smaller|larger|higher|lower|so))\b"
    rf"|\b(?:no|but)\b[\s,:;.!-]*{_VALUE}"
    # negating relations in LaTeX, and any relation with nothing on its left (`\geq 3`, `> 3`)
    r"|\\(?:neg|lnot|not|nleq|ngeq|nless|ngtr)(?![A-Za-z])"
    r"|^\s*(?:\\(?:geq?|leq?|neq?|geqslant|leqslant|lt|gt)(?![A-Za-z])|[<>≤≥≠~!])")
#: A remark in parentheses that names a value: a word (not a LaTeX command) and a digit (not a unit's power,
#: `(in cm^2)`) inside one pair.
_REMARK = re.compile(r"\((?=[^()]*(?<![\\A-Za-z])[A-Za-z]{2,})(?=[^()]*(?<![\^{\d])\d)[^()]*\)")


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_HAS_VALUE = re.compile(r"\d|\\[A-Za-z]|\$")


def hedged(answer: str | None) -> bool:
    """Whether a final answer negates or hedges a value (`not 3`, `at most 3`, `\\geq 3`, `3, not 4`) or names
    another in a remark (`4 (I first thought 3)`): such an answer names more than one candidate, and earns
    nothing. `\\text{...}` wrappers count as written out. Of a text of several sentences (a solution the math
    checker reads whole), the last sentence that holds a value, and what follows it, are its final answer: the
    reasoning before may weigh and reject values as it likes."""
    if not answer:
        return False
    text = re.sub(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}", r" \1 ", answer)
    sentences = [x for x in _SENTENCE_END.split(text) if x.strip()]
    last = max((k for k, x in enumerate(sentences) if _HAS_VALUE.search(x)), default=0)
    text = " ".join(sentences[last:]).strip().strip("$").strip()
    return bool(_HEDGES.search(text) or _REMARK.search(text))


def extract_answer(text: str | None) -> str | None:
    """The final answer: last `\\boxed{}` (or `\\fbox{}`; with the boxes listed right before it, all of them), else
    the last `<answer>` tag (a box inside it preferred), else "the answer is ..." up to the end of its line,
    without `$` and a final period."""
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
