-- Validation accuracy is greedy pass@1: an answer counts only when its verifier gives s_gt = 1 (a code answer
-- passes every test). val_accuracy, val_math and val_code hold that from now on; the mean s_gt (partial credit
-- for code) stays beside it as val_mean_s_gt.

ALTER TABLE checkpoints ADD COLUMN val_mean_s_gt DOUBLE;

CREATE OR REPLACE VIEW validation_curve AS
SELECT run_id, iteration, val_accuracy, val_math, val_code, is_best, adapter_path, val_mean_s_gt
FROM checkpoints WHERE val_accuracy IS NOT NULL;
