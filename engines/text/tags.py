"""Parsing of each role's output and the strict format reward.

Two jobs, kept apart on purpose (SAGE.md, "Format reward"; DESIGN.md, "Structured output per role"):
- `fields` is *lenient*: what the model meant even with broken tags (last complete pair, else an unclosed
  tag, else a bare closer; the Critic's last integer 1..10 without `<score>` [MAE], though without a complete
  `<score>` pair only in a short reply, never in reasoning cut off before its verdict; the last fenced block
  or `\\boxed{}` without `<answer>`).
- `format_reward` is *strict*: 1.0 when exactly the role's required tags appear, each once, not nested,
  balanced and non-empty (the Critic's must also hold an integer 1..10, since format is the Critic's whole
  reward); 0.5 when they are balanced but repeated; 0.0 otherwise. An empty completion scores 0.5 [MAE].
  Text outside the tags (reasoning) is allowed; another SAGE tag (say `<plan>` in a Solver answer) is not.
Tags are `<name>` / `</name>`, case-insensitive. Parsers never raise on model output: anything unexpected
ends as a 0.0 format reward with the reason stored. The regexes for constrained decoding and the tag
vocabulary live in `sage.engines.text.grammar` (re-exported here).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sage.engines.text.answers import last_boxed
from sage.engines.text.code import code_from, entry_point, last_fenced, parse_inputs, syntax_error
from sage.engines.text.grammar import (  # noqa: F401 - re-exported
    CHARS_PER_TOKEN,
    DEFAULT_TOKENS,
    DOMAINS,
    MATH_PROGRAM_ENTRY,
    REQUIRED_TAGS,
    ROLE_REGEX,
    TAG_NAMES,
    role_bounds,
    role_key,
    role_regex,
)

_TAG_RX = re.compile(r"<(/?)(" + "|".join(TAG_NAMES) + r")>", re.IGNORECASE | re.ASCII)
# An integer 1..10 that is not part of a decimal, nor the "10" of "8/10" or "8 out of 10".
_CRITIC_INT_RX = re.compile(r"(?<!\d)(?<!\d\.)(?<!/)(?<!/ )(?<!out of )(10|[1-9])(?!\d|\.\d)")
_NUMBER_RX = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_SCORE_CONTENT_RX = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:/\s*10)?\s*")
# Without a complete <score> pair, the Critic's score is read only from a reply this short (a one-line
# verdict), and after an unclosed <score> only from this little (`parse_critic` says why).
_VERDICT_CHARS = 200
_UNCLOSED_CHARS = 20


@dataclass
class Parsed:
    fields: dict[str, Any]
    format_reward: float
    reason: str | None = None       # why the format reward is not 1.0 ("missing <answer>", ...)


# ---------------------------------------------------------------------------------------------- tags
@dataclass
class _Tok:
    start: int
    end: int
    close: bool
    name: str


def _tokens(text: str) -> list[_Tok]:
    return [_Tok(m.start(), m.end(), bool(m.group(1)), m.group(2).lower()) for m in _TAG_RX.finditer(text)]


def _extract(text: str, toks: list[_Tok], name: str) -> str | None:
    """Lenient content of `name`: the last complete pair, else after the last opening tag up to the next
    tag, else before a bare closing tag back to the previous tag. Stripped; None when the tag is absent."""
    pair = last_open = last_close = None
    for i, t in enumerate(toks):
        if t.name != name:
            continue
        if not t.close:
            last_open = i
        else:
            last_close = i
            if last_open is not None and (pair is None or last_open > pair[0]):
                pair = (last_open, i)
    if pair is not None:
        return text[toks[pair[0]].end:toks[pair[1]].start].strip()
    if last_open is not None:
        stop = toks[last_open + 1].start if last_open + 1 < len(toks) else len(text)
        return text[toks[last_open].end:stop].strip()
    if last_close is not None:
        begin = toks[last_close - 1].end if last_close > 0 else 0
        return text[begin:toks[last_close].start].strip()
    return None


def _format(text: str, toks: list[_Tok], required: tuple[str, ...]) -> tuple[float, list[str], dict[str, list[str]]]:
    """Strict check: returns (reward, problems, contents of each complete pair by tag)."""
    problems: list[str] = []
    for name in required:
        if not any(t.name == name for t in toks):
            problems.append(f"missing <{name}>")
    unexpected = sorted({t.name for t in toks if t.name not in required}, key=TAG_NAMES.index)
    problems += [f"unexpected <{name}>" for name in unexpected]

    pairs: dict[str, list[str]] = {name: [] for name in required}
    current: _Tok | None = None
    for t in toks:
        if t.name not in required:
            continue
        if not t.close:
            if current is not None:
                problems.append(f"<{t.name}> inside <{current.name}>")
            current = t
        elif current is None:
            problems.append(f"unbalanced </{t.name}> without <{t.name}>")
        elif current.name != t.name:
            problems.append(f"</{t.name}> closes <{current.name}>")
            current = None
        else:
            pairs[t.name].append(text[current.end:t.start])
            current = None
    if current is not None:
        problems.append(f"unclosed <{current.name}>")
    if problems:
        return 0.0, _dedup(problems), pairs

    empty = [f"empty <{n}>" for n in required if any(not c.strip() for c in pairs[n])]
    if empty:
        return 0.0, empty, pairs
    repeated = [f"repeated <{n}>" for n in required if len(pairs[n]) > 1]
    if repeated:
        return 0.5, repeated, pairs
    return 1.0, [], pairs


def _dedup(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _never_raises(empty_fields: Callable[..., dict[str, Any]]):
    """Last line of defence: a parser bug on strange output becomes a 0.0 with the error as the reason.
    A bad `domain` is the caller's bug and raises before any parsing."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(text: str, *domain: str) -> Parsed:
            if domain:
                _check_domain(domain[0])
            if not isinstance(text, str):
                text = "" if text is None else str(text)
            try:
                return fn(text, *domain)
            except Exception as e:  # model output must never fail a stage
                return Parsed(empty_fields(*domain), 0.0, f"parser error: {type(e).__name__}: {e}")
        return inner
    return wrap


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"domain must be 'math' or 'code', got {domain!r}")


def _is_empty(text: str) -> bool:
    return not text.strip()


def _reason(problems: list[str]) -> str | None:
    return "; ".join(problems) if problems else None


# ---------------------------------------------------------------------------------------------- parsers
def _challenger_empty(domain: str, key: str | None = None) -> dict[str, Any]:
    if domain == "math":
        return {"question": None, "answer": None, "program": None}
    return {"question": None, "signature": None, "solution": None, "entry_point": None, "inputs": [],
            "input_errors": [], "syntax_error": "no code"}


@_never_raises(_challenger_empty)
def parse_challenger(text: str, domain: str, key: str | None = None) -> Parsed:
    """Challenger: math -> question, answer, program (the code in <solution>, which defines
    `MATH_PROGRAM_ENTRY`; None when absent); code -> question, signature, solution, entry_point, inputs (plus
    input_errors and syntax_error, for the verifier's validity). `key` is the format the reply is held to
    (`role_key`; default the domain's grounded form)."""
    if _is_empty(text):
        return Parsed(_challenger_empty(domain), 0.5, "empty completion")
    toks = _tokens(text)
    reward, problems, _ = _format(text, toks, REQUIRED_TAGS[key or f"challenger_{domain}"])
    question = _extract(text, toks, "question") or None
    if domain == "math":
        return Parsed({"question": question, "answer": _extract(text, toks, "answer") or None,
                       "program": code_from(_extract(text, toks, "solution"), "first")},
                      reward, _reason(problems))
    signature = _extract(text, toks, "signature") or ""
    signature = signature.replace("```python", "").replace("```", "").strip().rstrip(":").strip() or None
    solution = code_from(_extract(text, toks, "solution"), "first")
    inputs, input_errors = parse_inputs(_extract(text, toks, "inputs"))
    return Parsed({"question": question, "signature": signature, "solution": solution,
                   "entry_point": entry_point(signature, solution), "inputs": inputs,
                   "input_errors": input_errors, "syntax_error": syntax_error(solution)},
                  reward, _reason(problems))


@_never_raises(lambda: {"plan": None})
def parse_planner(text: str) -> Parsed:
    """Planner: plan = the text inside <plan>."""
    if _is_empty(text):
        return Parsed({"plan": None}, 0.5, "empty completion")
    toks = _tokens(text)
    reward, problems, _ = _format(text, toks, REQUIRED_TAGS["planner"])
    return Parsed({"plan": _extract(text, toks, "plan") or None}, reward, _reason(problems))


def normalise_score(value: int | None) -> float:
    """SAGE.md: an integer N in 1..10 -> (N - 1) / 9; anything else (None, a decimal, a number off the scale)
    -> the neutral 0.5 [MAE]. The prompt asks for an integer 1..10, so only that scale is read: `1.0` or `0.9`
    would otherwise be taken as an already-normalised score, and a Critic writing one could admit a question."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10:
        return (value - 1) / 9
    return 0.5


def _read_score(content: str) -> tuple[int | None, float]:
    m = _SCORE_CONTENT_RX.fullmatch(content)
    token = m.group(1) if m else None
    if token is None:
        nums = _NUMBER_RX.findall(content)
        token = nums[-1] if nums else None
    if token is None:
        return None, 0.5
    if "." in token or len(token) > 3:   # a decimal is off the integer scale the prompt asks for
        return None, 0.5
    n = int(token)
    return (n, normalise_score(n)) if 1 <= n <= 10 else (None, 0.5)


def _has_pair(toks: list[_Tok], name: str) -> bool:
    """Whether an opening `name` tag is followed, somewhere later, by its closing tag."""
    opened = False
    for t in toks:
        if t.name == name:
            if not t.close:
                opened = True
            elif opened:
                return True
    return False


@_never_raises(lambda: {"raw": None, "score": 0.5})
def parse_critic(text: str) -> Parsed:
    """Critic: raw (the integer read, or None) and score (normalised, 0.5 when unreadable or out of
    range). A complete <score>...</score> pair is always read (the last one). Without one, the lenient reads
    (the number after an unclosed <score>, the one before a bare </score>, else the last integer 1..10 in
    the text as MAE does) apply only to a short reply, a one-line verdict: at most `_VERDICT_CHARS` in all,
    and at most `_UNCLOSED_CHARS` after an unclosed <score>. A longer reply without a pair is reasoning cut
    off (or never finished) before its verdict, and its numbers are steps, counts and answers ("Step 9",
    "3 numbers", "7 hours"): reading one would let a stray number decide s_q and the question's admission,
    so it is neutral (raw None, score 0.5)."""
    if _is_empty(text):
        return Parsed({"raw": None, "score": 0.5}, 0.5, "empty completion")
    toks = _tokens(text)
    reward, problems, pairs = _format(text, toks, REQUIRED_TAGS["critic"])
    content = _extract(text, toks, "score")
    unclosed = any(t.name == "score" and not t.close for t in toks)
    raw, score = None, 0.5
    if content is not None and _has_pair(toks, "score"):
        raw, score = _read_score(content[:200])
    elif len(text.strip()) > _VERDICT_CHARS or (unclosed and len(content or "") > _UNCLOSED_CHARS):
        pass                                # reasoning that never gave its verdict: neutral
    elif content is not None:
        raw, score = _read_score(content)
    else:
        found = _CRITIC_INT_RX.findall(text)
        raw = int(found[-1]) if found else None
        score = normalise_score(raw)
    if reward > 0 and not all(re.fullmatch(r"\s*(10|[1-9])\s*", c) for c in pairs["score"]):
        reward, problems = 0.0, ["<score> is not an integer 1..10"]
    return Parsed({"raw": raw, "score": score}, reward, _reason(problems))


@_never_raises(lambda domain: {"answer": None})
def parse_solver(text: str, domain: str) -> Parsed:
    """Solver: math -> the content of <answer> (any \\boxed{} kept; else the last \\boxed{} anywhere);
    code -> Python source from the fenced block in <answer> (else the last fenced block anywhere)."""
    if _is_empty(text):
        return Parsed({"answer": None}, 0.5, "empty completion")
    toks = _tokens(text)
    reward, problems, _ = _format(text, toks, REQUIRED_TAGS[f"solver_{domain}"])
    content = _extract(text, toks, "answer")
    if domain == "math":
        answer = content or last_boxed(text)
    else:
        answer = code_from(content, "last") if content else last_fenced(text)
    return Parsed({"answer": answer or None}, reward, _reason(problems))
