"""What a math question's numbers and arithmetic say, read from its text alone, against the program a Challenger
wrote for it (stages/challenge.py grounds a label with these) and between questions (stages/admit.py).

- `number_mismatch`: the program's numeric literals are exactly the numbers the question states.
- `operation_mismatch`: every operation the program uses is one the question names.
- `arithmetic_mismatch`: where the question writes its arithmetic out (`What is 7 * 8?`, `y + 1 = 3`), the
  program's result is that arithmetic's value.
- `content_key`: what a question asks whatever its words (`x+8=15`, `gcd 11 12`), for duplicates in other words.
- `program_structure`, `question_structure`: which operations a problem composes, in which nesting, numbers
  abstracted (`gcd(mul(n,n),n)`), from a Challenger's program or a question's own arithmetic: a new structure is a
  new kind of problem, not new numbers in an old one.

Pure functions of text: no sandbox, no model. The program is read as a syntax tree, never run. The question and the
program are model output: each function returns a reason or None, and never raises on what it is given.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def number_mismatch(program: str, question: str) -> str | None:
    """Why the numeric literals of `program` are not exactly the numbers `question` states, each as many times
    (None when they are). A program that computes from a number the question never gives, or leaves out one it
    gives, computes another problem: on SmolLM2-135M's questions this rejected every ill-posed one whose program
    nevertheless ran (docs/curriculum-audit.md). A program that does not parse is left to the sandbox."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if any(isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)))
           or (isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("str", "chr", "bytes", "eval", "exec"))
           for n in ast.walk(tree)):   # `int("3" + "4")` would put 34 where the question says 3 + 4
        return "the program writes text; it must compute with the question's numbers"
    used = Counter(_number(repr(n.value)) for n in ast.walk(tree) if isinstance(n, ast.Constant)
                   and isinstance(n.value, (int, float)) and not isinstance(n.value, bool))
    stated = Counter(_number(t) for t in _NUMBER.findall(question))
    extra, missing = sorted(map(str, (used - stated).elements())), sorted(map(str, (stated - used).elements()))
    parts = []
    if extra:
        parts.append(f"the program uses {', '.join(extra[:5])}, which the question does not state")
    if missing:
        parts.append(f"the question states {', '.join(missing[:5])}, which the program does not use")
    return "; ".join(parts) or None


#: The operations a program may use, by class, and how a question names each (case-folded). `+` and `-` are one
#: class, as are `*` and `/`, so solving `x + 3 = 9` by `9 - 3` names its operation.
_NAMED = {
    "addition or subtraction": re.compile(r"[+\-\u2212]|\b(plus|minus|sum|add|added|adds|subtract\w*|difference|total|"
                                         r"more|less|fewer|left|remain\w*|altogether|together|increase\w*|"
                                         r"decrease\w*)\b"),
    "multiplication or division": re.compile(r"[*\u00d7\u00f7/%^]|\d\s*x\s*\d|\b(times|product|multipl\w*|divid\w*|"
                                             r"quotient|per|each|every|half|twice|double|triple|ratio|average|"
                                             r"mean|rate|square\w*|cube\w*|power|percent\w*|share|split)\b"),
    "gcd": re.compile(r"\bgcd\b|greatest common (divisor|factor)|highest common factor|\bhcf\b"),
    "lcm": re.compile(r"\blcm\b|(least|lowest) common multiple"),
}
_OPERATOR_CLASS = {ast.Add: "addition or subtraction", ast.Sub: "addition or subtraction",
                   ast.Mult: "multiplication or division", ast.Div: "multiplication or division",
                   ast.FloorDiv: "multiplication or division", ast.Mod: "multiplication or division",
                   ast.Pow: "multiplication or division"}
_CALL_CLASS = {"gcd": "gcd", "lcm": "lcm", "sum": "addition or subtraction", "pow": "multiplication or division",
               "prod": "multiplication or division"}
_NEUTRAL_CALLS = {"Fraction", "int", "float", "bool", "abs", "round", "range", "len", "list", "tuple"}


def operation_mismatch(program: str, question: str) -> str | None:
    """Why `program` does not compute with operations `question` names (None when it does): it computes nothing
    (returns a constant), or uses an operation whose class no symbol or word of the question names. With the
    program's result as the label (`math_labels: program`) the program is the only witness, and a program that
    applies its question's numbers to other operations (`20 - 18` for "the integer d with 18 <= d <= 20") grounds
    a wrong label. A program that does not parse is left to the sandbox."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign)):
            used.add(_OPERATOR_CLASS.get(type(node.op), type(node.op).__name__))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "?")
            if name not in _NEUTRAL_CALLS:
                used.add(_CALL_CLASS.get(name, f"{name}()"))
    if not used:
        return "the program computes nothing: it returns a constant"
    text = question.casefold()
    unnamed = sorted(c for c in used if c not in _NAMED or not _NAMED[c].search(text))
    return f"the question names no {', '.join(unnamed)}, which the program uses" if unnamed else None


#: One token of a question's own arithmetic: a number, a one-letter unknown, an operator, a bracket, `=`, space;
#: anything else (a word, `?`, `:`) ends a stretch of arithmetic.
_ARITH_TOKEN = re.compile(r"(?P<num>\d+(?:\.\d+)?|\.\d+)|(?P<var>(?<![A-Za-z])[A-Za-z](?![A-Za-z]))|(?P<op>[-+*/()=])"
                          r"|(?P<space>\s+)|(?P<other>.)", re.DOTALL)
_ARITH_SIGNS = str.maketrans({"\u00d7": "*", "\u00f7": "/", "\u2212": "-"})


def _linear(node: ast.AST, unknown: str | None) -> tuple[Fraction, Fraction] | None:
    """`node` as a * unknown + b, exactly, or None when it is not linear in the one unknown (or not arithmetic)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(0), Fraction(repr(node.value))
    if isinstance(node, ast.Name) and node.id == unknown:
        return Fraction(1), Fraction(0)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _linear(node.operand, unknown)
        return None if inner is None else (inner if isinstance(node.op, ast.UAdd) else (-inner[0], -inner[1]))
    if not isinstance(node, ast.BinOp):
        return None
    left, right = _linear(node.left, unknown), _linear(node.right, unknown)
    if left is None or right is None:
        return None
    (a, b), (c, d) = left, right
    if isinstance(node.op, ast.Add):
        return a + c, b + d
    if isinstance(node.op, ast.Sub):
        return a - c, b - d
    if isinstance(node.op, ast.Mult) and (a == 0 or c == 0):
        return a * d + c * b, b * d
    if isinstance(node.op, ast.Div) and c == 0 and d != 0:
        return a / d, b / d
    return None


def _arithmetic_value(stretch: str) -> Fraction | None:
    """The value a stretch of arithmetic states: an expression (`7 * 8`, `10 + 1 =`) is its value, a linear
    equation in one unknown (`y + 1 = 3`, `2x - 4 = 10`) its solution; None for anything else."""
    unknowns = set(re.findall(r"[A-Za-z]", stretch))
    if len(unknowns) > 1 or stretch.count("=") > 1 or len(stretch) > 120:
        return None
    unknown = unknowns.pop() if unknowns else None
    text = re.sub(r"(?<=[\d)])\s*(?=[A-Za-z(])|(?<=[A-Za-z)])\s*(?=\()", "*", stretch)   # 2x, 2(x+1), x(3)
    sides = [side.strip() for side in text.split("=")]
    try:
        trees = [ast.parse(side, mode="eval").body for side in sides if side]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    forms = [form for form in (_linear(tree, unknown) for tree in trees) if form is not None]
    if not forms or len(forms) < len(trees):   # a side that is not linear in the one unknown
        return None
    if len(forms) == 1:   # an expression, or one with a trailing `=` to fill in
        (a, b), = forms
        return b if a == 0 else None
    (a, b), (c, d) = forms
    if unknown is None or a == c:   # a stated fact (`2 + 3 = 5`) or no single solution
        return None
    return (d - b) / (a - c)


def own_arithmetic(question: str) -> str | None:
    """The one stretch of arithmetic that holds all of the question's numbers (`7 * 8` in "What is 7 * 8?",
    `y + 1 = 3` in "Find y: y + 1 = 3"), or None when there is no such stretch or more than one."""
    text = question.translate(_ARITH_SIGNS)[:2000]
    stretches, current = [], []
    for m in _ARITH_TOKEN.finditer(text):
        if m.lastgroup == "other":
            stretches.append("".join(current))
            current = []
        else:
            current.append(m.group())
    stretches.append("".join(current))
    numbers = Counter(_number(t) for t in _NUMBER.findall(text))
    checkable = [s.strip() for s in stretches
                 if re.search(r"[-+*/]", s) and Counter(_number(t) for t in _NUMBER.findall(s)) == numbers]
    return checkable[0] if len(checkable) == 1 else None


_DIVISOR_OR_MULTIPLE = {"gcd": re.compile(r"\bgcd\b|greatest common (?:divisor|factor)|highest common factor", re.I),
                        "lcm": re.compile(r"\blcm\b|least common multiple|lowest common multiple", re.I)}


def content_key(question: str) -> str | None:
    """What a math question asks, whatever its words: its own arithmetic with every unknown written `x` and no
    trailing `=` ("What is the value of l when l + 8 = 15?" and "Determine the value of d that satisfies: d + 8 =
    15" are both `x+8=15`), or for a GCD or an LCM its numbers sorted (`gcd 11 12`); None for anything else (a
    word problem). Two questions with one key ask the same problem in other words, which text similarity misses:
    in lever 15's run nine admitted questions restated an earlier one, three of them validation problems
    (docs/curriculum-audit.md). A question that asks something else of the same sum ("Is 12 + 10 even?") shares its
    key too: at worst a question lost, never a wrong label."""
    kinds = [k for k, pattern in _DIVISOR_OR_MULTIPLE.items() if pattern.search(question)]
    if len(kinds) == 1:
        numbers = sorted(f for f in (_number(t) for t in _NUMBER.findall(question)) if f is not None)
        return f"{kinds[0]} " + " ".join(map(str, numbers)) if len(numbers) >= 2 else None
    if kinds or (stretch := own_arithmetic(question)) is None:
        return None
    tokens = []
    for m in _ARITH_TOKEN.finditer(stretch):
        if m.lastgroup == "num":
            tokens.append(str(_number(m.group())))
        elif m.lastgroup == "var":
            tokens.append("x")
        elif m.lastgroup == "op":
            tokens.append(m.group())
    return "".join(tokens).rstrip("=") or None


def arithmetic_mismatch(question: str, result: str) -> str | None:
    """Why the program's `result` is not the value of the arithmetic its question writes out (None when it is, or
    when there is nothing to check): where all of the question's numbers stand in one stretch of arithmetic, an
    expression (`What is 7 * 8?`) or a linear equation in one unknown (`Find y: y + 1 = 3`), its value is known
    without the program, and a program that computes something else (`return 3 + 1` for `y + 1 = 3`, the one wrong
    math label in docs/curriculum-audit.md) grounds a wrong label."""
    stretch = own_arithmetic(question)
    if stretch is None or (value := _arithmetic_value(stretch)) is None:
        return None
    try:
        got = Fraction(result.strip())
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    if abs(got - value) <= Fraction(1, 10**9) * max(1, abs(value)):
        return None
    shown = str(value.numerator) if value.denominator == 1 else str(value)
    return f"the question's own arithmetic `{stretch[:60]}` gives {shown}; the program returns {result[:60]}"


#: Bounds on what the structure of a program or question is read from, and on the structure itself.
_MAX_PROGRAM, _MAX_NODES, _MAX_STRUCTURE = 4000, 400, 160
_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
           ast.Mod: "mod", ast.Pow: "pow"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
#: Operations whose arguments may come in any order and group (`add(n,add(n,n))` is `add(n,n,n)`).
_FLAT = frozenset({"add", "mul", "gcd", "lcm", "min", "max"})
#: Calls kept by name; `int`, `float` and `Fraction` of one value are that value; any other call is `call`.
_CALLS = frozenset({"gcd", "lcm", "abs", "round", "min", "max", "pow", "sqrt", "isqrt", "factorial", "comb", "perm",
                    "floor", "ceil", "prod", "sum"})
_TRANSPARENT = frozenset({"int", "float", "Fraction"})


class _NoStructure(Exception):
    """The tree holds something the structure does not describe (a loop, a branch, text), or too much."""


def _op(name: str, args: list[str]) -> str:
    if name in _FLAT:   # associative and commutative: flatten and sort
        args = sorted(a for arg in args for a in (_split(arg[len(name) + 1:-1]) if arg.startswith(name + "(")
                                                  else [arg]))
    out = f"{name}({','.join(args)})"
    if len(out) > _MAX_STRUCTURE:
        raise _NoStructure
    return out


def _split(inner: str) -> list[str]:
    """The top-level arguments of `inner`, the text between an operation's brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    return parts + [inner[start:]]


def _shape(node: ast.AST, env: dict[str, str]) -> str:
    """The structure of expression `node`, names read from `env` (a name not in it, like an unknown, is `v`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return "n"
    if isinstance(node, ast.Name):
        return env.get(node.id, "v")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _shape(node.operand, env)
        return inner if inner == "n" or isinstance(node.op, ast.UAdd) else _op("neg", [inner])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _op(_BINARY[type(node.op)], [_shape(node.left, env), _shape(node.right, env)])
    if isinstance(node, ast.Compare) and all(type(o) in _COMPARE for o in node.ops):
        name = "_".join(_COMPARE[type(o)] for o in node.ops)
        return _op(name, [_shape(n, env) for n in [node.left, *node.comparators]])
    if isinstance(node, ast.Call) and not node.keywords:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "sum" and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)):
            return _op("add", [_shape(e, env) for e in node.args[0].elts])
        args = [_shape(a, env) for a in node.args]
        if name in _TRANSPARENT and len(args) == 1:
            return args[0]
        return _op(name if name in _CALLS else "call", args)
    raise _NoStructure


def _statements(body: list[ast.stmt], env: dict[str, str]) -> str | None:
    """The structure of what `body` returns, assignments inlined in order; None when it returns nothing."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)) or (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):   # a docstring
            continue
        if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            value = _shape(stmt.value, env)
            env.update({t.id: value for t in stmt.targets if isinstance(t, ast.Name)})
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and type(stmt.op) in _BINARY:
            env[stmt.target.id] = _op(_BINARY[type(stmt.op)], [env.get(stmt.target.id, "v"),
                                                                _shape(stmt.value, env)])
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            return _shape(stmt.value, env)
        else:
            raise _NoStructure
    return None


def program_structure(program: str) -> str | None:
    """Which operations the Challenger's `program` composes to its result, in which nesting, every number written
    `n` (`return math.gcd(12 * 4, 18)` is `gcd(mul(n,n),n)`), its variables inlined, `+`, `*`, gcd, lcm, min and max
    flattened and sorted; None when it does not parse, is too large, or holds what the structure does not describe
    (a loop, a branch, a helper function, text). The program is model output: read as a syntax tree, never run."""
    if len(program) > _MAX_PROGRAM:
        return None
    try:
        tree = ast.parse(program)
        if sum(1 for _ in ast.walk(tree)) > _MAX_NODES:
            return None
        env: dict[str, str] = {}
        solve = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "solve"]
        rest = [s for s in tree.body if not (isinstance(s, ast.FunctionDef) and s.name == "solve")]
        if len(solve) != 1 or solve[0].args.args or _statements(rest, env) is not None:
            return None
        return _statements(solve[0].body, env)
    except (_NoStructure, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _solved(side: ast.AST, other: ast.AST, unknown: str) -> ast.AST | None:
    """`unknown` alone: `other` with the operations around the unknown in `side` undone in turn (`2*x + 8 = 15`
    gives `(15 - 8) / 2`, the program that solves it); None unless the unknown stands once, under + - * / only."""
    while not (isinstance(side, ast.Name) and side.id == unknown):
        if not isinstance(side, ast.BinOp) or type(side.op) not in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            return None
        holds = [any(isinstance(n, ast.Name) and n.id == unknown for n in ast.walk(s)) for s in (side.left, side.right)]
        if holds.count(True) != 1:
            return None
        inner, rest = (side.left, side.right) if holds[0] else (side.right, side.left)
        inverse = {ast.Add: ast.Sub(), ast.Sub: ast.Add(), ast.Mult: ast.Div(), ast.Div: ast.Mult()}[type(side.op)]
        if not holds[0] and isinstance(side.op, (ast.Sub, ast.Div)):   # b - x = c: x = b - c; b / x = c: x = b / c
            other = ast.BinOp(rest, side.op, other)
        else:
            other = ast.BinOp(other, inverse, rest)
        side = inner
    return other


def question_structure(question: str) -> str | None:
    """The structure of the problem `question` states in its own words, for a question without a program (a seed):
    a GCD or LCM of k numbers (`gcd(n,n)`), an expression it writes out (`mul(n,n)` for "What is 7 * 8?"), or a
    linear equation in one unknown as the program that solves it (`div(sub(n,n),n)` for `2x + 8 = 15`), so a
    question and a program that state the same problem share a structure; None for anything else (a word problem)."""
    kinds = [k for k, pattern in _DIVISOR_OR_MULTIPLE.items() if pattern.search(question)]
    if len(kinds) == 1:
        count = len(_NUMBER.findall(question[:2000]))
        return _op(kinds[0], ["n"] * count) if 2 <= count <= 8 else None
    if kinds or (stretch := own_arithmetic(question)) is None:
        return None
    unknowns = set(re.findall(r"[A-Za-z]", stretch))
    if len(unknowns) > 1 or stretch.count("=") > 1 or len(stretch) > 120:
        return None
    text = re.sub(r"(?<=[\d)])\s*(?=[A-Za-z(])|(?<=[A-Za-z)])\s*(?=\()", "*", stretch)   # 2x, 2(x+1), x(3)
    try:
        sides = [ast.parse(side.strip(), mode="eval").body for side in text.split("=") if side.strip()]
        if len(sides) == 1 and not unknowns:
            return _shape(sides[0], {})
        if len(sides) != 2 or not unknowns:
            return None
        unknown = unknowns.pop()
        left = any(isinstance(n, ast.Name) and n.id == unknown for n in ast.walk(sides[0]))
        solved = _solved(sides[0], sides[1], unknown) if left else _solved(sides[1], sides[0], unknown)
        return None if solved is None else _shape(solved, {})
    except (_NoStructure, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
