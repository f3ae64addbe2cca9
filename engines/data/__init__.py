"""Problems that come from outside the loop: seed problems (`seeds`: reasoning-gym, codeio, HumanEval or a
user's file), benchmarks (`benchmarks`: offline packages, the hub, or local files), how a benchmark's code
verifier runs in the sandbox and what passes (`code_jobs`, with `assertions` for official `check` functions),
HumanEval's tasks turned into sandbox jobs (`humaneval`), and the one reader of local JSONL, JSON and Parquet files
that seeds and benchmarks share (`files`). The default sets load offline from installed packages."""
