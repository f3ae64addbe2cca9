"""Math checker: decide whether a predicted answer is equivalent to the reference with math-verify, without ever
hanging. Finding the final answer in a model's text is `sage.engines.text.answers.extract_answer`'s job; what it
leaves (a bare answer, or prose with no box, tag or "the answer is") comes here.

math-verify's own timeouts use `signal.alarm` and fail off the main thread, so they are disabled
(`parsing_timeout=None, timeout_seconds=None`) and every check runs in a warm worker process
(`python -m sage.engines.verify.mathcheck`, RLIMIT_AS = `memory_mb`) under a hard external deadline: a worker that
misses it is SIGKILLed and replaced, and the pair scores 0. Answers longer than `max_answer_chars` score
0 unchecked. Beyond math-verify, a normalised exact-string match also counts (math-verify does not decide
every equivalence a human would, e.g. plain-text answers).

How the worker reads: the reference, and a prediction that is a bare answer, are parsed whole (as
`\\boxed{answer}`, so `2x+1` is not cut to its first number); a prediction written as prose ("so x = 5",
"She has 7 apples left.") is read by math-verify's own extraction, which finds the final answer in free
text, falling back on the whole answer when it finds nothing. Prose is an answer that keeps a word once
math-verify's normalisation has dropped trailing units and turned "and"/"or" into commas (`is_prose`); a
trailing unit with a power (`8 cm^2`) is dropped as math-verify drops one without.
Case is kept where it carries meaning: `P` is not `p`, `X+1` not `x+1`, `\\Delta` not `\\delta`
(`_keep_case`); words still compare without case (`\\text{Yes}` and `yes`). A lone `i` is the imaginary
unit, so `e^{i\\pi}` equals `-1`.

Protocol with a worker: one JSON line per request on stdin, `[id, op, a, b]` with op "check" (gold a,
prediction b) or "parse" (answer a); one JSON line per reply on stdout, `[id, result]`; the worker says
`["ready"]` once math-verify is imported and has run one check.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from collections import deque

from sage.configs.schema import MathCheckConfig
from sage.engines.text.answers import hedged
from sage.engines.verify.isolation import die_with_parent

STARTUP_TIMEOUT_S = 120.0

# ------------------------------------------------------------------------------------------ normalisation


def normalize(answer: str) -> str:
    """Light rewriting before math-verify: math delimiters, `\\text{}` wrappers, `1.5e3`."""
    s = answer.strip()
    s = re.sub(r"^\$+|\$+$", "", s).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = re.sub(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"(?<![\w.])(\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)(?![\w.])", r"\1\\times10^{\2}", s)
    s = s.replace("**", "^")
    s = re.sub(r"(?<![\\A-Za-z])pi(?![A-Za-z])", r"\\pi", s)
    return s.strip()


def _no_percent(answer: str) -> str:
    return re.sub(r"\\?%", "", answer)


_WORD = re.compile(r"[A-Za-z]{2,}")
#: A word standing alone in an answer: two or more letters between spaces, not a LaTeX command.
_PROSE_WORD = re.compile(r"(?:^|\s)[A-Za-z]{2,}[.,:;!?]?(?=\s|$)")


def _plain(answer: str) -> str:
    """`answer` without spaces, `$`, spacing commands and a final period; lowercased only when it is a word
    (`Yes`, `yes`), never when it holds symbols, whose case carries meaning (`P`, `X+1`), nor when it is written
    in capitals: `AB`, `ABC`, `PQ` name points, segments and triangles, so `AB` is not `ab`."""
    s = re.sub(r"[\s$]|\\[,;! ]|\\left|\\right", "", answer).rstrip(".")
    return s.lower() if _WORD.fullmatch(s) and not s.isupper() else s


def is_prose(answer: str) -> bool:
    """Whether `answer` is written as prose rather than as a bare answer: a word still stands in it after
    math-verify's normalisation, which drops trailing units (`12 cm`, `48 \\text{ square units}`) and turns
    "and"/"or" into commas (`2 and 3`). `\\text{...}` wrappers count as written out."""
    from latex2sympy2_extended import NormalizationConfig, normalize_latex

    cfg = NormalizationConfig(basic_latex=True, units=True, malformed_operators=False, nits=False, boxed="none")
    return bool(_PROSE_WORD.search(normalize_latex(normalize(answer), cfg)))


# ------------------------------------------------------------------------------------------ worker side


def _keep_case() -> None:
    """Make math-verify tell symbols apart by case. latex2sympy2_extended lowercases every symbol by default
    (`ConversionConfig.lowercase_symbols`) and math-verify's `parse` passes no config, so `P` equalled `p`;
    its grader then compares symbol names longer than one letter without case (meant for words: `\\text{Yes}`
    against `yes`), which made `\\Delta` equal `\\delta` and `X_1` equal `x_1`. Here `parse` converts with
    `lowercase_symbols=False`, and two symbols compare without case only when both are words (two or more
    letters, not all capitals, not a Greek letter's name); everything else the grader does is unchanged."""
    import functools

    import math_verify.grader as grader
    import math_verify.parser as parser
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig, latex2sympy
    from latex2sympy2_extended.symbols import GREEK_LETTER_MAP
    from sympy import Symbol

    parser.latex2sympy = functools.partial(latex2sympy, conversion_config=ConversionConfig(lowercase_symbols=False))
    greek = frozenset(GREEK_LETTER_MAP.values())
    compare_words = grader.sympy_compare_symbols

    def is_word(name: str) -> bool:  # a name in capitals (`AB`) is points, not a word
        return len(name) > 1 and name.isalpha() and not name.isupper() and name not in greek

    def compare_symbols(gold, pred) -> bool:
        if isinstance(gold, Symbol) and isinstance(pred, Symbol) and not (is_word(gold.name) and is_word(pred.name)):
            return gold.name == pred.name
        return compare_words(gold, pred)

    grader.sympy_compare_symbols = compare_symbols


def _imaginary(found: list) -> list:
    """math-verify's parse with a lone symbol `i` read as the imaginary unit (latex2sympy2_extended maps only
    `I` to it), so that `e^{i\\pi}` is -1 and `(1+i)^2` is `2i`. An `i` that is only ever a bound variable (a
    summation or product index, an integration variable) is no unit: math-verify saw the letter and parsed every
    symbol as complex (`should_treat_as_complex`), so `\\sum_{i=1}^n i` held a complex `n` and never equalled
    `n(n+1)/2`; its symbols are made real again, as they are when the index has another name."""
    from math_verify.grader import should_treat_as_complex
    from sympy import Basic, I, Symbol

    latex = next((x for x in found if isinstance(x, str)), "")
    out = []
    for x in found:
        if isinstance(x, Basic):
            names = {s.name for s in x.atoms(Symbol)}
            if "i" in names and "i" not in {s.name for s in x.free_symbols} \
                    and not should_treat_as_complex(re.sub(r"(?<![\\A-Za-z])i(?![A-Za-z])", "k", latex)):
                x = x.xreplace({s: Symbol(s.name, real=True) for s in x.atoms(Symbol) if s.is_real is False})
            unit = {s: I for s in x.free_symbols if isinstance(s, Symbol) and s.name == "i"}
            if unit:
                try:
                    x = x.xreplace(unit)
                except Exception:  # where the unit cannot stand (an interval's end): keep the symbol
                    pass
        out.append(x)
    return out


def _without_unit_power(answer: str) -> str:
    """`8 cm^2` as `8 cm`: math-verify drops a trailing unit (its list, latex2sympy2_extended's `units`), but
    with a power only when written `\\text{cm}^2`."""
    from latex2sympy2_extended.math_normalization import units_regex_pattern

    return re.sub(rf"(\s(?:{units_regex_pattern}))\s*\^\s*(?:\d|\{{\d\}})\s*$", r"\1", answer)


def _worker() -> None:
    """Worker loop (runs as `python -m sage.engines.verify.mathcheck MEMORY_MB`)."""
    import resource

    mem = int(sys.argv[1]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    import logging

    logging.disable(logging.WARNING)
    from math_verify import parse, verify

    _keep_case()

    def parsed(ans):
        """A bare answer, parsed whole."""
        return _imaginary(parse("\\boxed{" + _without_unit_power(normalize(ans)) + "}", parsing_timeout=None))

    def read(ans):
        """A prediction: prose through math-verify's extraction, a bare answer (or prose it finds nothing in)
        whole."""
        if is_prose(ans):
            found = _imaginary(parse(ans, parsing_timeout=None))
            if found:
                return found
        return parsed(ans)

    def equal(a, b):
        gold, pred = parsed(a), read(b)
        if gold and pred and verify(gold, pred, timeout_seconds=None):
            return True
        if "%" in a and "%" not in b:  # "12.5\\%" vs "12.5": the reference's percent sign may go unwritten,
            return equal(_no_percent(a), b)  # but one the answer wrote stays: "0.5\\%" is not 0.5
        return False

    try:  # the lazy imports of a first parse, extraction and comparison (sympy's), paid before "ready", outside
        equal("\\frac{1}{2}", "so x = 0.5")  # any check's time limit: a cold first check timed out under load
    except BaseException:
        pass
    out = sys.stdout
    out.write('["ready"]\n')
    out.flush()
    for line in sys.stdin:
        rid, op, a, b = json.loads(line)
        try:
            if op == "parse":
                result = bool(parsed(a))
            else:
                result = 1.0 if equal(a, b) else 0.0
        except BaseException:  # MemoryError, RecursionError, sympy internals
            result = False if op == "parse" else 0.0
        out.write(json.dumps([rid, result]) + "\n")
        out.flush()


# ------------------------------------------------------------------------------------------ parent side


#: The folder holding the `sage` package this process imported: the worker runs from there (`-m` puts it first on
#: its path), so it runs the same checker code as its parent, not whichever checkout the environment installed.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["sage"].__file__)))


class _Worker:
    def __init__(self, memory_mb: int):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sage.engines.verify.mathcheck", str(memory_mb)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
            preexec_fn=die_with_parent, cwd=_ROOT)
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buf = b""
        self.ready = False
        self.started = time.monotonic()
        self.task: tuple[int, float] | None = None  # (request index, deadline)

    def send(self, rid: int, op: str, a: str, b: str | None, deadline: float) -> None:
        self.proc.stdin.write((json.dumps([rid, op, a, b]) + "\n").encode())
        self.proc.stdin.flush()
        self.task = (rid, deadline)

    def lines(self) -> list | None:
        """Complete reply lines read so far; None when the worker died (EOF)."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        if not data:
            return None
        self.buf += data
        *done, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in done if x.strip()]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class MathChecker:
    """A pool of warm math-verify workers. `check_many([(gold, pred), ...]) -> [1.0 | 0.0, ...]`."""

    def __init__(self, cfg: MathCheckConfig | None = None, workers: int | None = None):
        self.cfg = cfg or MathCheckConfig()
        self.n_workers = max(1, workers or os.cpu_count() or 1)
        self._workers = [_Worker(self.cfg.memory_mb) for _ in range(self.n_workers)]
        self._lock = threading.Lock()
        self.timeouts = 0  # checks killed by the external deadline (for tests and reports)

    # public ---------------------------------------------------------------------------------

    def check_many(self, pairs: list[tuple[str, str]]) -> list[float]:
        """1.0 where `pred` is equivalent to `gold` (gold first), else 0.0; never hangs."""
        scores, todo = [0.0] * len(pairs), []
        for i, (gold, pred) in enumerate(pairs):
            if not self._usable(gold) or not self._usable(pred):
                continue
            if hedged(pred) and not hedged(gold):  # `not 3`, `at least 3`, `4 (I first thought 3)`: no answer
                continue
            if _plain(normalize(gold)) == _plain(normalize(pred)):
                scores[i] = 1.0
            else:
                todo.append((i, "check", gold, pred))
        for i, value in self._run(todo).items():
            scores[i] = float(value)
        return scores

    def check(self, gold: str, pred: str | None) -> float:
        return self.check_many([(gold, pred)])[0]

    def parses_many(self, answers: list[str]) -> list[bool]:
        todo = [(i, "parse", a, None) for i, a in enumerate(answers) if self._usable(a)]
        done = self._run(todo)
        return [bool(done.get(i, False)) for i in range(len(answers))]

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                w.kill()
            self._workers = []

    def __enter__(self) -> MathChecker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    # scheduling -----------------------------------------------------------------------------

    def _usable(self, answer) -> bool:
        return isinstance(answer, str) and len(answer) <= self.cfg.max_answer_chars and bool(answer.strip())

    def _run(self, todo: list[tuple]) -> dict[int, object]:
        results: dict[int, object] = {}
        if not todo:
            return results
        with self._lock:
            if not self._workers:
                raise RuntimeError("MathChecker is closed")
            queue = deque(todo)
            by_id = {t[0]: list(t) + [0] for t in todo}  # request + times its worker died under it
            while queue or any(w.task for w in self._workers):
                self._dispatch(queue)
                self._collect(results, queue, by_id)
        return results

    def _dispatch(self, queue: deque) -> None:
        for w in self._workers:
            if queue and w.ready and w.task is None:
                rid, op, a, b = queue.popleft()
                try:
                    w.send(rid, op, a, b, time.monotonic() + self.cfg.timeout_s)
                except (BrokenPipeError, OSError):
                    queue.appendleft((rid, op, a, b))
                    self._replace(w)

    def _collect(self, results: dict, queue: deque, by_id: dict) -> None:
        now = time.monotonic()
        deadlines = [w.task[1] for w in self._workers if w.task] + \
                    [w.started + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
        wait = max(0.0, min(deadlines) - now) if deadlines else 0.05
        sel = selectors.DefaultSelector()
        for w in self._workers:
            sel.register(w.fd, selectors.EVENT_READ, w)
        try:
            events = sel.select(min(wait, 1.0))
        finally:
            sel.close()
        for key, _ in events:
            w = key.data
            lines = w.lines()
            if lines is None:  # died (memory cap, crash, killed): retry once elsewhere, then score 0
                if w.task:
                    req = by_id[w.task[0]]
                    req[4] += 1
                    if req[4] < 2:
                        queue.append(tuple(req[:4]))
                    else:
                        results[w.task[0]] = 0.0
                    w.task = None
                self._replace(w)
                continue
            for msg in lines:
                if msg == ["ready"]:
                    w.ready = True
                elif w.task and msg[0] == w.task[0]:
                    results[msg[0]] = msg[1]
                    w.task = None
        self._expire(results)

    def _expire(self, results: dict) -> None:
        now = time.monotonic()
        for w in list(self._workers):
            if w.task and now > w.task[1]:
                results[w.task[0]] = 0.0
                self.timeouts += 1
                self._replace(w)
            elif not w.ready and now > w.started + STARTUP_TIMEOUT_S:
                raise RuntimeError("math-verify worker did not start (is math-verify installed?)")

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self.cfg.memory_mb)


_DEFAULT: MathChecker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_checker() -> MathChecker:
    """A process-wide checker with default settings (created on first use)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathChecker()
        return _DEFAULT


def answer_parses(answer: str) -> bool:
    """True when math-verify's `parse` extracts something from `answer` (checked in a worker)."""
    return default_checker().parses_many([answer])[0]


if __name__ == "__main__":
    _worker()
