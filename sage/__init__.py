"""SAGE: multi-agent self-evolution (Challenger, Planner, Critic, Solver) with external verifiers and TRR++.

The installed package is `sage`; its sub-packages live in the repository's top-level folders, mapped by
`pyproject.toml` (`package-dir`): `sage.flows` is `flows/`, `sage.stages` is `stages/`, `sage.engines` is
`engines/`, `sage.warehouse` is `warehouse/`, `sage.configs` is `configs/`. Imports only point down that
list (DESIGN.md's layers). This folder holds nothing else.
"""
