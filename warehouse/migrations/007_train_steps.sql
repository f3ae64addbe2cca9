-- One row per optimizer update of a run's iteration, written by the train stage as each update ends (so a
-- reader sees the curve grow while the iteration trains). `tokens`: prompt + completion tokens of the rows the
-- update trained on (all processes); `seconds`: wall clock from the previous update's end (the first: from the
-- start of training). Retraining an iteration replaces its rows (warehouse/redo.py, stages/train.py).

CREATE TABLE train_steps (
    run_id         VARCHAR NOT NULL,
    iteration      INTEGER NOT NULL,
    step           INTEGER NOT NULL,   -- 1..n_updates within the iteration
    loss           DOUBLE,
    grad_norm      DOUBLE,
    entropy        DOUBLE,
    clip_fraction  DOUBLE,             -- TRL's clip_ratio/region_mean
    learning_rate  DOUBLE,
    tokens         BIGINT,
    seconds        DOUBLE,
    created_at     TIMESTAMP NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (run_id, iteration, step)
);

-- The training curve of each run across iterations: `global_step` counts updates from the run's first
-- iteration on, so the curves of successive iterations join end to end.
CREATE OR REPLACE VIEW training_curve AS
SELECT run_id, iteration, step,
       row_number() OVER (PARTITION BY run_id ORDER BY iteration, step)                         AS global_step,
       loss, grad_norm, entropy, clip_fraction, learning_rate, tokens,
       sum(tokens) OVER (PARTITION BY run_id ORDER BY iteration, step)                          AS tokens_total,
       seconds,
       sum(seconds) OVER (PARTITION BY run_id, iteration ORDER BY step)                         AS iteration_seconds,
       created_at
FROM train_steps;
