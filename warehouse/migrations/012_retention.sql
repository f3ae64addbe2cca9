-- Checkpoint retention (`train.keep_last`): when `sage run` deletes a checkpoint's adapter directory, or only the
-- optimizer state beside it, the row says when, so `sage export`, `sage eval` and a redone stage name what was
-- deleted instead of reading a missing file. adapter_path keeps the path the adapter had (rollouts and
-- iterations still name it as the adapter that generated them). Deleting the adapter deletes its optimizer state.

ALTER TABLE checkpoints ADD COLUMN adapter_pruned_at TIMESTAMP;
ALTER TABLE checkpoints ADD COLUMN optimizer_pruned_at TIMESTAMP;

CREATE OR REPLACE VIEW validation_curve AS
SELECT run_id, iteration, val_accuracy, val_math, val_code, is_best, adapter_path, val_mean_s_gt, adapter_pruned_at
FROM checkpoints WHERE val_accuracy IS NOT NULL;
