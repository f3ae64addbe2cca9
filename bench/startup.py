"""Start-up time of the quick commands: `sage sql "select 1"`, `sage status`, `sage config`.

    .venv/bin/python -m bench.startup [--revision REV] [--n 5]

Each command runs as a fresh subprocess against an empty warehouse, best of N wall-clock times. With
`--revision`, the same commands run from that revision's files (extracted with `git archive` into a temporary
folder, imported in place of the working tree's) beside the working tree's, with their ratio. Then the
working tree's slowest imports under `import sage.flows.cli` (`python -X importtime`), and which heavy
libraries that import loads.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"configs": "configs", "engines": "engines", "flows": "flows", "stages": "stages", "warehouse": "warehouse"}
HEAVY = ("torch", "transformers", "prefect", "pandas", "pyarrow", "pydantic", "yaml", "duckdb")


def tree_of(revision: str, into: Path) -> Path:
    """A `sage` package importable from `into` (put on PYTHONPATH), holding `revision`'s files."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = into / "path" / "sage"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").symlink_to(src / "sage" / "__init__.py")
    for name, folder in PACKAGES.items():
        (pkg / name).symlink_to(src / folder)
    return into / "path"


def best_of(args: list[str], n: int, pythonpath: Path | None, cwd: Path) -> float:
    """Best wall time of `sage ARGS` over `n` runs, from `cwd` (not the repository root, whose `sage/` folder
    `python -m` would put first on the path)."""
    env = dict(os.environ)
    if pythonpath is not None:  # ahead of the editable install's finder
        env["PYTHONPATH"] = str(pythonpath)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "sage.flows.cli", *args], capture_output=True, text=True, env=env,
                           cwd=cwd)
        times.append(time.perf_counter() - t)
        if r.returncode != 0:
            raise SystemExit(f"sage {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return min(times)


def import_breakdown(top: int = 10) -> tuple[list[tuple[float, str]], list[str]]:
    """The `top` slowest modules (cumulative seconds) under `import sage.flows.cli`, and the heavy ones it loads."""
    code = f"import sys, sage.flows.cli; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True)
    rows = []
    for line in r.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]) / 1e6, parts[2].rstrip()))
    return sorted(rows, reverse=True)[:top], [m for m in r.stdout.strip().split(",") if m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--revision", help="git revision to compare with (e.g. the commit before a change)")
    ap.add_argument("--n", type=int, default=5, help="runs per command; the best counts")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        from sage.warehouse import Warehouse

        Warehouse.open(tmp / "warehouse.duckdb").close()
        before = tree_of(a.revision, tmp / "rev") if a.revision else None
        commands = {'sql "select 1"': ["sql", "--dir", str(tmp), "select 1"],
                    "status": ["status", "--dir", str(tmp)], "config": ["config"]}
        head = f"{'command (best of ' + str(a.n) + ')':<28}{'now':>9}"
        print(head + (f"{a.revision:>12}{'now/before':>12}" if before else ""))
        for name, args in commands.items():
            now = best_of(args, a.n, None, tmp)
            line = f"{'sage ' + name:<28}{now:>8.2f}s"
            if before is not None:
                then = best_of(args, a.n, before, tmp)
                line += f"{then:>11.2f}s{now / then:>12.2f}"
            print(line)
    slowest, heavy = import_breakdown()
    print(f"\nimport sage.flows.cli loads: {', '.join(heavy) or 'none of ' + ', '.join(HEAVY)}")
    print(f"{'cumulative':>10}  module")
    for seconds, module in slowest:
        print(f"{seconds:>9.3f}s  {module}")


if __name__ == "__main__":
    main()
