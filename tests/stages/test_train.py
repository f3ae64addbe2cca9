"""The train stage's choice of each rollout's training temperature."""

from __future__ import annotations

from sage.configs import load_config
from sage.stages.train import sampling_temperature


def test_each_role_trains_at_its_own_sampling_temperature_and_greedy_at_one():
    cfg = load_config(overrides=["roles.critic.temperature=0.7", "roles.solver.temperature=1.3",
                                 "roles.planner.temperature=0"])
    assert sampling_temperature(cfg, "critic") == 0.7
    assert sampling_temperature(cfg, "solver") == 1.3
    assert sampling_temperature(cfg, "planner") == 1.0  # greedy: no tempered distribution, trained at 1
    assert sampling_temperature(cfg, "challenger") == cfg.roles.challenger.temperature
