"""Sample generations shown to people (Prefect's per-iteration artifact, `sage report`): model output is hostile
text, so it is shown inside code fences it cannot close (markdown) or HTML-escaped, with control characters
as escapes, and cut to a length a page can hold."""

from __future__ import annotations

import html
import re

_NUMBERS = ("format_reward", "reward", "advantage")


def _printable(text: str, limit: int = 1200) -> str:
    """`text` cut to `limit` characters, control characters other than newline and tab shown as escapes."""
    text = text if len(text) <= limit else text[:limit] + " ..."
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def fenced(text: str, limit: int = 1200) -> str:
    """Model output inside a code fence no backtick run in it can close, control characters shown as escapes."""
    text = _printable(text, limit)
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def _numbers(r: dict) -> str:
    return ", ".join(f"{k} {r[k]:.3f}" for k in _NUMBERS if r.get(k) is not None)


def samples_markdown(iteration: int, samples: list[dict]) -> str:
    """The sample generations as markdown: per role, the end of the prompt and the completion, with its
    format reward, reward and advantage."""
    lines = [f"# Iteration {iteration}: sample generations", ""]
    for role in sorted({r["role"] for r in samples}):
        lines += [f"## {role}", ""]
        for r in (x for x in samples if x["role"] == role):
            lines += [f"**{r['purpose']}** ({_numbers(r)})", "", "Prompt (end):", fenced(r["prompt_tail"]), "",
                      "Completion:", fenced(r["completion_text"] or ""), ""]
    return "\n".join(lines)


def samples_html(samples: list[dict]) -> str:
    """The same sample generations as HTML (`sage report`): per role, escaped `<pre>` blocks."""
    if not samples:
        return '<p class="note">no generations</p>'
    parts = []
    for role in sorted({r["role"] for r in samples}):
        parts.append(f"<h3>{html.escape(role)}</h3>")
        for r in (x for x in samples if x["role"] == role):
            prompt, completion = (html.escape(_printable(r[k] or "")) for k in ("prompt_tail", "completion_text"))
            parts.append(f"<p><b>{html.escape(r['purpose'])}</b> ({html.escape(_numbers(r))})</p>"
                         f"<details><summary>prompt (end)</summary><pre>{prompt}</pre></details>"
                         f"<pre>{completion}</pre>")
    return "".join(parts)
