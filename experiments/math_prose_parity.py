"""Verdicts on answers written the way models write them: the project's path (`extract_answer`, then the math
checker) and math-verify called directly, each against the truth, on a hand-labelled corpus.

    .venv/bin/python -m experiments.math_prose_parity [--workers 2]

Each case is (kind, reference answer, model text, truth). The texts are what a Solver puts in its answer: final
answers inside prose, with units, with `\\boxed{}` absent, repeated or listed, symbols whose case matters, and
wrong answers that look right (the right number in the wrong place, a sign, a swapped pair, a rejected
candidate). The truth is decided by reading the text, never by either checker. The project reads a text the
way the verify stage does: `extract_answer(text) or text.strip()`, then `MathChecker.check(gold, pred)`;
math-verify directly: `verify(parse(f"${gold}$"), parse(text))` (its default extraction, as
`experiments.math_parity` calls it). Prints agreement with the truth per kind and overall, with Wilson 95%
intervals, the cases where the two differ, and every case either gets wrong.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sage.configs.schema import MathCheckConfig
from sage.engines.text.answers import extract_answer
from sage.engines.verify.mathcheck import MathChecker

T, F = True, False

#: (kind, reference answer, model text, truth)
CASES: list[tuple[str, str, str, bool]] = [
    # final answers inside prose, no box
    ("prose", "42", "The answer is 42.", T),
    ("prose", "5", "so x = 5", T),
    ("prose", "5", "Solving the equation gives x = 5.", T),
    ("prose", "12", "Adding the two groups, there are 12 students in total.", T),
    ("prose", "7", "She has 7 apples left.", T),
    ("prose", r"\frac{3}{4}", r"Thus the probability is $\frac{3}{4}$.", T),
    ("prose", r"\frac{1}{2}", r"We get $\frac{1}{2}$.", T),
    ("prose", "24", "Therefore, the area is $24$ square units.", T),
    ("prose", "17", "Answer: 17", T),
    ("prose", "17", "**Final Answer:** 17", T),
    ("prose", "3", "It takes 3 hours to fill the tank.", T),
    ("prose", "10", "The maximum is attained at x=2, giving 10.", T),
    ("prose", "-3", "The value of $k$ is $-3$.", T),
    ("prose", r"2\sqrt{3}", r"After simplifying we obtain $2\sqrt{3}$.", T),
    ("prose", r"\frac{5}{2}", "Dividing both sides by 2, we find that x = 5/2.", T),
    ("prose", "0.25", "The probability is 0.25.", T),
    ("prose", r"25\%", "So 25% of the class passed.", T),
    ("prose", "150", "The train travels 150 km.", T),
    ("prose", "9", "The final answer is 9. I hope it is correct.", T),
    ("prose", "8", "The final answer is $8$.", T),
    ("prose", "36", "Since the perimeter is 24, each side is 6 and the area is 36.", T),
    ("prose", "1", "Plugging in, f(1) = 1.", T),
    ("prose", "x^2+1", "The answer is x^2+1", T),
    ("prose", "x^2+1", "Therefore $f(x) = x^2 + 1$.", T),
    ("prose", "(2, 3)", "The intersection point is $(2, 3)$.", T),
    ("prose", "4", "There are 4 ways to choose them.", T),
    ("prose", "100", "So he needs 100 more dollars.", T),
    ("prose", r"\sqrt{2}", r"The distance is $\sqrt{2}$ units.", T),
    ("prose", "2", r"Since $2^3 = 8 \equiv 1 \pmod 7$, $2^{10} = 2 \cdot (2^3)^3 \equiv 2$, so the remainder is 2.", T),
    ("prose", "13", "Counting them, we get 13.", T),
    ("prose", "60", r"Each angle of the triangle measures $60^\circ$.", T),
    ("prose", "1250", r"The total cost is \$1,250.", T),
    ("prose", "3.5", "On average she reads 3.5 books a month.", T),
    ("prose", "x = 4", "Hence x = 4.", T),
    ("prose", "-2", "The smaller root is $x = -2$.", T),
    ("prose", "5", "5, since the other solution is negative and lengths are positive.", T),
    ("prose", "12", "We need 12.", T),
    ("prose", "720", "There are $6! = 720$ arrangements.", T),
    ("prose", "20", "So, Tom is 20 years old now.", T),
    ("prose", r"\frac{1}{6}", "The probability of rolling a 6 is 1/6.", T),
    ("prose", "11", "The sum of the digits is 1 + 0 + 1 + 9 = 11.", T),
    ("prose", r"\frac{3}{4}", r"The probability is \frac{3}{4}.", T),
    ("prose", r"2\sqrt{3}", r"The side length is 2\sqrt{3}.", T),
    ("prose", "x^2+1", "so f(x) = x^2+1", T),
    ("prose", "12", "Let the number be n. Then 3n = 36.\nSo n = 12.", T),
    ("prose", "12", "Let the number be n. Then 3n = 36.\nDividing, n = 12.\nCheck: 3 * 12 = 36.", T),
    ("prose", "-4", "We have $x^2 + 8x + 16 = 0$, i.e. $(x+4)^2 = 0$, so $x = -4$.", T),
    ("prose", r"\frac{\sqrt{3}}{2}", r"Using the unit circle, $\sin 60^\circ = \frac{\sqrt{3}}{2}$.", T),
    ("prose", "1", r"The limit is $\lim_{x\to 0} \frac{\sin x}{x} = 1$.", T),
    ("prose", r"\frac{9}{2}", "Solve for x:\n2x - 4 = 5\n2x = 9\nx = 9/2", T),
    ("prose", "3", "**Step 1:** isolate x.\n**Step 2:** divide by 4.\nThe answer: x = 3", T),
    ("prose", r"\text{Yes}", "Yes, it is possible.", T),
    ("prose", "25", "Tom was 20 five years ago, so he is 25 now.", T),
    ("prose", "36", "There are 12 boxes with 3 apples each, so 36 apples.", T),
    ("prose", "3", "x = 2 is extraneous, so the only solution is x = 3.", T),
    ("prose", "8", "7 is not correct; the answer is 8.", T),
    ("prose", "72", "12 cm^2 is the area of one face; the total is 72 cm^2.", T),
    ("prose", "360", "There are $6! = 720$ arrangements, but half are repeats, so 360.", T),
    ("prose", "15", "15 cm^2 (the perimeter would be 16 cm)", T),
    ("prose", "1+i", "The answer is $1 + i$.", T),
    # units on a bare answer
    ("units", "12", "12 cm", T),
    ("units", "5", "5 meters", T),
    ("units", "90", "90 degrees", T),
    ("units", "90", r"$90^\circ$", T),
    ("units", "15", "15 dollars", T),
    ("units", "15", r"\$15", T),
    ("units", r"2\sqrt{3}", r"2\sqrt{3} cm", T),
    ("units", "48", r"48 \text{ square units}", T),
    ("units", "3.5", "3.5 hours", T),
    ("units", "7", "7 apples", T),
    ("units", r"\frac{1}{2}", r"\frac{1}{2} \text{ inch}", T),
    ("units", "60", "60 mph", T),
    ("units", "1000", "1,000 people", T),
    ("units", "25", r"25 \mathrm{kg}", T),
    ("units", r"36\pi", r"36\pi \text{ cm}^3", T),
    ("units", "8", "8 cm^2", T),
    ("units", "40", "40 km/h", T),
    ("units", "5", "5 units", T),
    ("units", "30", "30 minutes", T),
    ("units", "12", "12 cm.", T),
    ("units", "12", "13 cm", F),
    ("units", "5", "50 meters", F),
    ("units", "90", "45 degrees", F),
    ("units", "15", r"\$15.50", F),
    ("units", r"2\sqrt{3}", r"3\sqrt{2} cm", F),
    # boxes: absent, repeated, listed, corrected
    ("boxed", "4", r"First I got \boxed{3}, but that was wrong. The answer is \boxed{4}.", T),
    ("boxed", "3", r"First I got \boxed{3}, but that was wrong. The answer is \boxed{4}.", F),
    ("boxed", "3, 4", r"The solutions are \boxed{3} and \boxed{4}.", T),
    ("boxed", "4", r"The solutions are \boxed{3} and \boxed{4}.", F),
    ("boxed", "3, 4", r"The solutions are \boxed{3} and \boxed{-4}.", F),
    ("boxed", "5", "\\boxed{5}\n\n**Final Answer**\n\\boxed{5}", T),
    ("boxed", "5", r"The answer is \boxed{5}. Double-checking: \boxed{5}", T),
    ("boxed", "6", r"We try \boxed{5}? No: recounting gives \boxed{6}.", T),
    ("boxed", "5", r"We try \boxed{5}? No: recounting gives \boxed{6}.", F),
    ("boxed", "x^2", r"so \boxed{\frac{1}{2}} and finally \boxed{x^{2}}", T),
    ("boxed", r"\frac{1}{2}", r"$\boxed{\frac{1}{2}}$", T),
    ("boxed", "-1, 1", r"\boxed{-1}, \boxed{1}", T),
    ("boxed", "2", r"x = \boxed{2}", T),
    ("boxed", "8", r"\boxed{8}", T),
    ("boxed", "8", r"\boxed{8.}", T),
    ("boxed", "8", r"\fbox{8}", T),
    ("boxed", r"\frac{7}{2}", r"So $a + b = \boxed{\dfrac{7}{2}}$.", T),
    ("boxed", "2, 5", r"x = \boxed{2} or x = \boxed{5}", T),
    ("boxed", "12", r"Total: \boxed{12} apples", T),
    ("boxed", "(1, -2)", r"The vertex is at \boxed{(1, -2)}.", T),
    ("boxed", "(1, -2)", r"The vertex is at \boxed{(-2, 1)}.", F),
    ("boxed", "10", r"$\boxed{10}$ is the answer; the other candidate, $\boxed{12}$, fails the check.", T),
    ("boxed", "7", r"\boxed{7} \quad \text{(checked by substitution)}", T),
    # symbols whose case carries meaning, and words whose case does not
    ("case", r"\Delta", r"\delta", F),
    ("case", r"\delta", r"\delta", T),
    ("case", "P", "p", F),
    ("case", "P", "P", T),
    ("case", "X+1", "x+1", F),
    ("case", "x+1", "x+1", T),
    ("case", "x+1", "1+x", T),
    ("case", r"\Omega", r"\omega", F),
    ("case", r"\Phi", r"\phi", F),
    ("case", "x_1", "X_1", F),
    ("case", r"2\pi r", r"2\pi R", F),
    ("case", r"2\pi r", r"2 \pi r", T),
    ("case", r"V = \frac{4}{3}\pi r^3", r"V = \frac{4}{3}\pi R^3", F),
    ("case", "n^2", "N^2", F),
    ("case", r"\Delta x", r"\delta x", F),
    ("case", r"\sin \theta", r"\sin \Theta", F),
    ("case", "k", "The constant is $K$.", F),
    ("case", "k", "The constant is $k$.", T),
    ("case", r"\alpha + \beta", r"\beta + \alpha", T),
    ("case", "ab", "ba", T),
    ("case", r"\text{Yes}", "yes", T),
    ("case", r"\text{No}", "No.", T),
    ("case", r"\text{even}", "Even", T),
    ("case", r"\text{Evelyn}", "Evelyn", T),
    ("case", "C", "(C)", T),
    ("case", r"\text{(C)}", "C", T),
    ("case", "C", "The correct option is (C).", T),
    ("case", "C", "The correct option is (D).", F),
    # clean bare answers
    ("bare", r"\frac{1}{2}", "0.5", T),
    ("bare", r"2\sqrt{3}", r"\sqrt{12}", T),
    ("bare", "x^2+2x+1", "(x+1)^2", T),
    ("bare", "(1, 2)", "(1,2)", T),
    ("bare", "[0, 1)", "[0,1)", T),
    ("bare", r"\{1, 2\}", r"\{2, 1\}", T),
    ("bare", "2x+1", "2x+1", T),
    ("bare", "2", "2x+1", F),
    ("bare", r"\frac{\pi}{2}", r"\pi/2", T),
    ("bare", "3", "3.0", T),
    ("bare", "e^2", r"\exp(2)", T),
    ("bare", "y = 2x + 3", "y = 3 + 2x", T),
    ("bare", "-1, 1", r"\pm 1", T),
    ("bare", "2, 3", "3, 2", T),
    ("bare", "1/3", "0.33", F),
    ("bare", r"\infty", r"\infty", T),
    ("bare", "10", "10.", T),
    ("bare", r"2\sqrt{3}", r"2\sqrt{2}", F),
    ("bare", "0.25", "25", F),
    ("bare", "2", r"$x = \frac{1}{2}$", F),
    # complex numbers
    ("complex", "-1", r"e^{i\pi}", T),
    ("complex", r"e^{i\pi}", "-1", T),
    ("complex", "2i", "(1+i)^2", T),
    ("complex", "i", r"\sqrt{-1}", T),
    ("complex", "3+2i", "2i+3", T),
    ("complex", "3+2i", "3-2i", F),
    ("complex", "1", "i^4", T),
    ("complex", "-1", "i^2", T),
    ("complex", "0", r"e^{i\pi} + 1", T),
    ("complex", "-i", "i", F),
    # wrong answers that look right
    ("wrong", "42", "The answer is 24.", F),
    ("wrong", "5", "so x = -5", F),
    ("wrong", "12", "We first compute 12 + 3 = 15, so the total is 15.", F),
    ("wrong", "12", "There are 12 boxes with 3 apples each, so 36 apples.", F),
    ("wrong", "3/4", "The probability is 4/3.", F),
    ("wrong", r"\frac{3}{4}", r"Thus the probability is $\frac{4}{3}$.", F),
    ("wrong", "2", "x = 2 is extraneous, so the only solution is x = 3.", F),
    ("wrong", "7", "7 is not correct; the answer is 8.", F),
    ("wrong", "100", "The answer is 1000.", F),
    ("wrong", r"10\%", "The answer is 10.5%.", F),
    ("wrong", "0.5", "The probability is 0.05.", F),
    ("wrong", r"2\sqrt{3}", r"After simplifying we obtain $3\sqrt{2}$.", F),
    ("wrong", "(2, 3)", "The intersection point is $(3, 2)$.", F),
    ("wrong", "x^2+1", "Therefore $f(x) = x^2 - 1$.", F),
    ("wrong", "-2", "The smaller root is $x = 2$.", F),
    ("wrong", "5", "so x = 5 or x = -5", F),
    ("wrong", "20", "Tom was 20 five years ago, so he is 25 now.", F),
    ("wrong", "1250", r"The total cost is \$1,205.", F),
    ("wrong", r"\frac{1}{6}", "The probability of rolling a 6 is 1/36.", F),
    ("wrong", "-3", "The value of $k$ is $3$.", F),
    ("wrong", "9", "The final answer is 6. I hope it is correct.", F),
    ("wrong", "x = 4", "Hence x = -4.", F),
    ("wrong", "13", "Counting them, we get 31.", F),
    ("wrong", "12", "12 cm^2 is the area of one face; the total is 72 cm^2.", F),
    ("wrong", r"\sqrt{2}", "The distance is $2$ units.", F),
    ("wrong", "720", "There are $6! = 720$ arrangements, but half are repeats, so 360.", F),
    ("wrong", "36", "Since the perimeter is 24, each side is 6 and the area is 24.", F),
    ("wrong", "8", "8 is what I first guessed, but the answer is 9.", F),
    ("wrong", "x^2+1", "so f(x) = x^2+2", F),
    ("wrong", "6", "Each side is 6 cm, so the perimeter is 24 cm.", F),
    ("wrong", "3", "It takes 3 hours for one pipe, so 1.5 hours for both.", F),
    ("wrong", r"\frac{1}{2}", "The probability is 1/2 of 1/2, which is 1/4.", F),
    ("wrong", r"\text{No}", "Yes", F),
    ("wrong", "2", r"The answer is $\boxed{2x}$.", F),
]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def direct(cases: list[tuple[str, str, str, bool]], dollars: bool = False) -> list[bool]:
    """math-verify called directly on each (gold, text); with `dollars`, a text it extracts nothing from is read
    again as `$text$` (a bare LaTeX answer given the delimiters its extraction looks for)."""
    import logging

    from math_verify import parse, verify

    logging.disable(logging.WARNING)
    out = []
    for _, gold, text, _ in cases:
        try:
            pred = parse(text, parsing_timeout=None)
            if dollars and not pred:
                pred = parse(f"${text}$", parsing_timeout=None)
            out.append(bool(verify(parse(f"${gold}$", parsing_timeout=None), pred, timeout_seconds=None)))
        except Exception:
            out.append(False)
    return out


def ours(cases: list[tuple[str, str, str, bool]], workers: int) -> list[bool]:
    """The project's path: the verify stage's extraction, then the math checker."""
    pairs = [(gold, extract_answer(text) or text.strip()) for _, gold, text, _ in cases]
    with MathChecker(MathCheckConfig(), workers=workers) as mc:
        return [s == 1.0 for s in mc.check_many(pairs)]


def _row(label: str, right: int, n: int) -> str:
    lo, hi = wilson(right, n)
    return f"{label} {right:>3}/{n:<3} {100 * right / n:5.1f}% [{100 * lo:4.1f}, {100 * hi:5.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    runs = {"ours": ours(CASES, args.workers), "math-verify": direct(CASES), "math-verify $": direct(CASES, True)}
    truth = [t for *_, t in CASES]
    print(f"cases={len(CASES)} (true {sum(truth)}, false {len(CASES) - sum(truth)}); right against the truth, "
          "Wilson 95% interval; 'math-verify $': the text as `$text$` where math-verify finds nothing in it")
    for kind in [*dict.fromkeys(k for k, *_ in CASES), "all"]:
        idx = [i for i, c in enumerate(CASES) if kind in ("all", c[0])]
        print(f"{kind:<7} n={len(idx):>3}  " + "  ".join(
            _row(name, sum(got[i] == truth[i] for i in idx), len(idx)) for name, got in runs.items()))
    mine, theirs = runs["ours"], runs["math-verify"]
    for name, got in runs.items():
        print(f"{name}: false credit {sum(g and not t for g, t in zip(got, truth))}, "
              f"missed {sum(t and not g for g, t in zip(got, truth))}")
    print(f"right where the other is wrong: ours {sum(a == t != b for a, b, t in zip(mine, theirs, truth))}, "
          f"math-verify {sum(b == t != a for a, b, t in zip(mine, theirs, truth))}")
    for (kind, gold, text, t), *got in zip(CASES, *runs.values()):
        if any(g != t for g in got):
            print(f"  {kind}: gold {gold!r} text {text!r} truth {t}: "
                  + ", ".join(f"{name} {g}" for name, g in zip(runs, got)))


if __name__ == "__main__":
    main()
