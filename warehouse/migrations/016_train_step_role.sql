-- Under `train.adapters` per_role each role trains its own adapter in a pass of its own: `train_steps.role` says
-- whose adapter an update moved (NULL: the one adapter every role shares). The passes of an iteration number their
-- updates on from one another (the Solver's first), so `step` stays the iteration's update count.

ALTER TABLE train_steps ADD COLUMN role VARCHAR;

CREATE OR REPLACE VIEW training_curve AS
SELECT run_id, iteration, step, role,
       row_number() OVER (PARTITION BY run_id ORDER BY iteration, step)                         AS global_step,
       loss, grad_norm, entropy, clip_fraction, learning_rate, tokens,
       sum(tokens) OVER (PARTITION BY run_id ORDER BY iteration, step)                          AS tokens_total,
       seconds,
       sum(seconds) OVER (PARTITION BY run_id, iteration ORDER BY step)                         AS iteration_seconds,
       created_at
FROM train_steps
ORDER BY run_id, iteration, step;
