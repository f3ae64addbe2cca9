import json
import re

import pytest

from sage.configs import ConfigError, config_from_dict, config_hash, load_config
from sage.configs.schema import SageConfig

pytestmark = pytest.mark.fast


def test_profiles_load_with_paper_defaults():
    cpu = load_config("cpu")
    assert cpu.model.name == "smollm2-135m-instruct" and cpu.model.backend == "hf"
    paper = load_config("paper-7b")
    assert paper.model.name == "Qwen/Qwen2.5-7B-Instruct" and paper.model.backend == "vllm"
    assert (paper.train.lora_rank, paper.train.lr) == (128, 3e-6)
    # SAGE.md defaults, never literals in code
    d = SageConfig()
    assert (d.iteration.alpha, d.iteration.beta) == (0.7, 0.3)
    assert (d.rewards.planner_critic, d.rewards.planner_format) == (0.5, 0.5)
    assert (d.rewards.solver_plan, d.rewards.solver_gt, d.rewards.solver_format) == (0.2, 0.6, 0.2)
    assert (d.train.clip_eps_low, d.train.clip_eps_high, d.train.kl_beta) == (0.2, 0.28, 0.0)
    assert d.roles.solver.temperature == 1.0


def test_every_field_has_help_text():
    for section, info in SageConfig.model_fields.items():
        assert info.description, section
        for name, f in info.annotation.model_fields.items():
            assert f.description, f"{section}.{name}"


def test_set_overrides_one_field_with_yaml_types():
    cfg = load_config("cpu", ["iteration.alpha=0.8", "iteration.domains=[math]", "train.isolate=true"])
    assert cfg.iteration.alpha == 0.8
    assert cfg.iteration.domains == ["math"]
    assert cfg.train.isolate is True
    assert config_hash(cfg) != config_hash(load_config("cpu"))  # alpha decides admissions: another run


@pytest.mark.parametrize("overrides, names", [
    (["iteration.alphaa=0.8"], "iteration.alphaa: unknown key"),
    (["nosection.x=1"], "nosection: unknown key"),
    (["iteration.n_probe=many"], "iteration.n_probe"),
    (["iteration.alpha=1.5"], "iteration.alpha"),
    (["iteration.beta=-0.1"], "iteration.beta"),
    (["rewards.solver_gt=0.7"], "solver reward weights must sum to 1"),
    (["rewards.planner_critic=0.6"], "planner reward weights must sum to 1"),
    (["model.backend=tgi"], "model.backend"),
    (["model.backend=vllm", "model.max_lora_rank=8"], "model.max_lora_rank"),
    (["roles.solver.unconstrained=[0.5, 1.5]"], "roles.solver: unconstrained"),
])
def test_bad_config_names_the_field(overrides, names):
    with pytest.raises(ConfigError) as e:
        load_config("cpu", overrides)
    assert names in str(e.value)


def test_vllm_never_takes_its_own_logprobs_as_pi_old():
    """vLLM's log-probs under a grammar or top_p are of the masked or truncated distribution: `train.old_policy`
    sampler is refused with vllm (auto recomputes there), and allowed on hf, whose are the policy's."""
    with pytest.raises(ConfigError, match=r"train.old_policy sampler takes vLLM's log-probs as pi_old"):
        load_config("cpu", ["model.backend=vllm", "train.isolate=true", "train.old_policy=sampler"])
    assert load_config("cpu", ["train.old_policy=sampler"]).train.old_policy == "sampler"


def test_vllm_trains_in_a_process_of_its_own_or_not_at_all():
    """vLLM's GPU memory and the trainer's must not meet in the flow process: `model.backend: vllm` needs
    `train.isolate` (or an accelerate launch, also processes of their own) while training is on; every profile
    that names vllm sets it."""
    with pytest.raises(ConfigError, match=r"model.backend vllm with train.isolate false trains in the flow process.*"
                                          r"set train.isolate=true \(or train.accelerate_config"):
        load_config("cpu", ["model.backend=vllm"])
    for fine in (["train.isolate=true"], ["train.accelerate_config=ddp"], ["train.enabled=false"]):
        assert load_config("cpu", ["model.backend=vllm", *fine]).model.backend == "vllm"
    from sage.configs import PROFILES_DIR

    for profile in sorted(PROFILES_DIR.glob("*.yaml")):
        cfg = load_config(profile)
        assert cfg.model.backend != "vllm" or cfg.train.isolate, profile.name


def test_grammar_annealing_schedule_holds_its_last_share():
    roles = load_config("cpu", ["roles.solver.unconstrained=[0.0, 0.25, 0.5]"]).roles
    assert [roles.solver.unconstrained_share(i) for i in (1, 2, 3, 4, 10)] == [0.0, 0.25, 0.5, 0.5, 0.5]
    assert roles.critic.unconstrained_share(3) == 0.0   # no schedule: every sample constrained
    free = load_config("cpu", ["roles.solver.constrain=false"]).roles.solver  # cpu.yaml's schedule stays, idle
    assert free.unconstrained and free.unconstrained_share(2) == 0.0


def test_bad_override_syntax_and_profile():
    with pytest.raises(ConfigError, match="section.field=value"):
        load_config("cpu", ["alpha"])
    with pytest.raises(ConfigError, match="unknown profile"):
        load_config("nope")


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("iteration: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("iteration:\n  alfa: 0.5\n")
    with pytest.raises(ConfigError, match="iteration.alfa"):
        load_config(typo)


def test_a_yaml_file_that_is_not_utf8_or_not_a_file(tmp_path, monkeypatch):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("run:\n  dir: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=re.escape(f"config file {latin}:2: not UTF-8 text (byte 15); re-save")):
        load_config(latin)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match=re.escape(f"config {folder} is a directory; give a profile name (cpu")):
        load_config(folder)
    with pytest.raises(ConfigError, match=re.escape(f"config {tmp_path} is a directory")):
        load_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu").mkdir()  # a folder named like a profile does not hide the profile
    assert load_config("cpu").model.name


def test_wrong_type_in_dict():
    with pytest.raises(ConfigError, match="train.lora_rank"):
        config_from_dict({"train": {"lora_rank": "big"}})


# Fields that must stay in a run's identity: each decides rows (which questions, samples, rewards, adapters).
IN = ["model.name", "model.backend", "model.dtype", "run.seed", "seeds.source", "seeds.n_math", "seeds.seed",
      "roles.solver.max_new_tokens", "roles.critic.temperature", "iteration.n_challenge", "iteration.n_plan",
      "iteration.alpha", "rewards.solver_gt", "train.enabled", "train.lr", "train.lora_rank",
      "validate.n_math", "validate.n_code", "validate.max_new_tokens", "sandbox.timeout_s", "mathcheck.timeout_s"]
OUT = ["run.iterations", "run.dir", "run.batch_rows", "model.cache_dir", "train.isolate", "train.keep_last",
       "validate.every", "validate.patience", "orchestration"]


def test_run_identity_fields_in_and_out():
    from sage.configs import EXCLUDED
    from sage.configs.identity import RETIRED, identity

    assert set(OUT) <= set(EXCLUDED) and all(reason.strip() for reason in EXCLUDED.values())
    kept = {f"{section}.{field}" for section, fields in identity(load_config("cpu")).items() for field in fields}
    assert not any(k == e or k.startswith(e + ".") for k in kept for e in EXCLUDED)
    for name in IN:
        assert name.split(".")[0] + "." + name.split(".")[1] in kept, name
    every = {f"{section}.{f}" for section, info in type(load_config("cpu")).model_fields.items()
             for f in info.annotation.model_fields}
    retired = {key for key, (_, in_identity) in RETIRED.items() if in_identity}  # kept at their one value
    assert retired <= kept
    assert (kept - retired) | {e for e in every if any(e == x or e.startswith(x + ".") for x in EXCLUDED)} == every


@pytest.mark.parametrize("override", ["run.iterations=5", "run.batch_rows=7", "train.isolate=true",
                                      "train.keep_last=null", "validate.every=1", "validate.patience=9",
                                      "model.cache_dir=/elsewhere", "orchestration.runner=ray"])
def test_schedule_and_placement_keep_the_hash(override):
    assert config_hash(load_config("cpu", [override])) == config_hash(load_config("cpu"))


def test_placement_stays_out_of_the_run_identity(tmp_path):
    """A run started with the local runner resumes on Ray (same id, stored config updated); a change to what
    the run computes is refused with the fields that differ and how to start a new run instead."""
    from sage.flows.session import Session
    from sage.warehouse.queries import run_config
    from sage.warehouse.runs import RunConfigMismatch

    base = ["run.dir=" + str(tmp_path)]
    local = load_config("cpu", base)
    ray = load_config("cpu", base + ["orchestration.runner=ray", "run.iterations=4"])
    assert config_hash(local) == config_hash(ray)
    with Session(tmp_path) as s:
        run_id = s.create_run(local)
        assert s.create_run(ray) == run_id
        stored = run_config(s.warehouse, run_id)
        assert '"runner": "ray"' in stored[0] and '"iterations": 4' in stored[0] and stored[1] == config_hash(local)
        with pytest.raises(RunConfigMismatch) as e:
            s.create_run(load_config("cpu", base + ["train.lr=0.5", "iteration.alpha=0.9"]), run_id)
        assert f"iteration.alpha: {local.iteration.alpha} -> 0.9" in str(e.value)
        assert f"train.lr: {local.train.lr} -> 0.5" in str(e.value)
        assert "--run NAME" in str(e.value) and "run.iterations" not in str(e.value)


def test_a_config_stored_before_an_option_was_removed_loads_with_its_hash():
    """Runs recorded while `model.compile`, `train.update_order` and `train.share_prefix` existed resume: at the
    value they all ran with, the fields load as absent and the run's hash (its default id) is unchanged."""
    from sage.configs import config_json

    new = load_config("cpu", [])
    stored = json.loads(config_json(new))
    stored["model"]["compile"] = False
    stored["train"].update(update_order="shuffled", share_prefix=False)
    assert config_from_dict(stored) == new
    assert config_hash(stored) == config_hash(new)
    stored["train"]["update_order"] = "by_prompt"
    assert config_hash(stored) != config_hash(new)
    with pytest.raises(ConfigError,
                       match=r"run r: train.update_order = \"by_prompt\" names an option that was removed"):
        config_from_dict(stored, source="run r")


def test_a_field_added_later_keeps_earlier_run_ids_and_a_changed_one_is_another_run():
    """The ablation switches (`configs.identity.ADDED`): at their default the hash is the one the config had before
    they existed, so `sage run` with an unchanged profile finds its run; switched off, the run is another one, and
    a stored run without them resumes, or refuses the switch with the field named."""
    from sage.configs import config_json, identity_diff
    from sage.configs.identity import ADDED

    for profile in ("cpu", "paper-7b"):
        new = load_config(profile)
        before = json.loads(config_json(new))
        for key, value in ADDED.items():
            section, field = key.split(".")
            if before[section][field] == value:   # paper-7b sets roles.prompts and seeds.sets: another run anyway
                del before[section][field]
        assert config_hash(before) == config_hash(new) and identity_diff(before, new) == []
        assert config_from_dict(before) == new
    hashes = {config_hash(load_config("cpu", off)) for off in
              ([], ["iteration.challenger=false"], ["iteration.planner=false"],
               ["iteration.challenger=false", "iteration.planner=false"])}
    assert len(hashes) == 4
    assert identity_diff(before, load_config("paper-7b", ["iteration.planner=false"])) == [
        "iteration.planner: true -> false"]


def test_trackers_are_off_by_default_and_a_name_transformers_does_not_know_is_refused():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    from sage.configs.schema import TRACKERS

    assert tuple(sorted(INTEGRATION_TO_CALLBACK)) == TRACKERS   # the schema's copy of transformers' list
    assert load_config("cpu").train.report_to == [] and load_config("paper-7b").train.report_to == []
    assert load_config("cpu", ["train.report_to=[tensorboard, wandb]"]).train.report_to == ["tensorboard", "wandb"]
    with pytest.raises(ConfigError, match="'tensorbord', which transformers does not know; use any of azure_ml"):
        load_config("cpu", ["train.report_to=[tensorbord]"])


def test_validation_answers_are_as_long_as_the_solvers_unless_set():
    """validate.max_new_tokens null (the default) is the Solver's length: paper-7b validates at 8,192 tokens as its
    Solver writes, and a stored run with the number written out is the same run."""
    from sage.stages.context import StageContext
    from sage.stages.validate import _validation_context

    paper = load_config("paper-7b")
    assert paper.validate.max_new_tokens is None and paper.validate.answer_tokens(paper.roles.solver) == 8192
    assert load_config("cpu").validate.answer_tokens(load_config("cpu").roles.solver) == 192   # set explicitly
    d = SageConfig()
    explicit = d.model_copy(update={"validate": d.validate.model_copy(update={"max_new_tokens": 1024})})
    assert config_hash(d) == config_hash(explicit)              # null = the Solver's 1024, as runs stored it
    longer = load_config("cpu", ["roles.solver.max_new_tokens=300", "validate.max_new_tokens=null"])
    ctx = _validation_context(StageContext(longer, None, engines=object(), fanout=object()), None)  # type: ignore
    assert ctx.cfg.roles.solver.max_new_tokens == 300


def test_paper_7b_makes_one_optimizer_update_an_iteration():
    """An iteration is one training step (SAGE.md): every trained rollout of a full iteration in one update."""
    from sage.engines.train.rows import rows_per_update

    cfg = load_config("paper-7b")
    it = cfg.iteration
    rows = it.n_challenge * 2 + it.n_plan * 2 + it.n_plan * it.n_solve   # challenge, critiques, plans, answers
    assert rows == 1024 and rows <= rows_per_update(cfg.train)
    assert cfg.roles.prompts == "reasoning" and load_config("cpu").roles.prompts == "short"
