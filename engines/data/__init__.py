"""Problems that come from outside the loop: seed problems (`seeds`: reasoning-gym, codeio, HumanEval or a
user's file), benchmarks (`benchmarks`: offline packages, the hub, or local files), and HumanEval's tasks
turned into sandbox jobs (`humaneval`). All of them load offline from installed packages."""
