-- Validation of the Planner -> gate -> Solver pipeline (`validate.pipeline`), beside the plain validation that
-- decides early stopping: the share of validation questions answered right when every answer is shown the model's
-- own greedy plan (val_plan_shown), when only plans that pass the gate are shown and the rest answer plainly
-- (val_pipeline), and the share of plans that passed (val_plans_passed). NULL where the pipeline was not validated.

ALTER TABLE checkpoints ADD COLUMN val_plan_shown DOUBLE;
ALTER TABLE checkpoints ADD COLUMN val_pipeline DOUBLE;
ALTER TABLE checkpoints ADD COLUMN val_plans_passed DOUBLE;

CREATE OR REPLACE VIEW validation_curve AS
SELECT run_id, iteration, val_accuracy, val_math, val_code, is_best, adapter_path, val_mean_s_gt, adapter_pruned_at,
       val_plan_shown, val_pipeline, val_plans_passed
FROM checkpoints WHERE val_accuracy IS NOT NULL;
