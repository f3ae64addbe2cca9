-- Every scores row names the version of the reward formulas that computed it, and its id hashes that
-- version with the rollout (`sage.stages.score.score_id`), so a re-score after a formula change adds rows
-- beside the old ones instead of mixing with them. Rows written before this migration are version 1 (the
-- suppressed Challenger branch was (s_q + r_f) / 2 then).

CREATE TABLE scores_versioned (
    score_id       VARCHAR PRIMARY KEY,
    rollout_id     VARCHAR NOT NULL,
    reward_version INTEGER NOT NULL,
    run_id         VARCHAR NOT NULL,
    iteration      INTEGER NOT NULL,
    role           VARCHAR NOT NULL,
    domain         VARCHAR,
    reward         DOUBLE NOT NULL,
    components     JSON NOT NULL,
    group_key      VARCHAR NOT NULL,
    advantage      DOUBLE NOT NULL,
    created_at     TIMESTAMP NOT NULL DEFAULT current_timestamp,
    UNIQUE (rollout_id, reward_version)
);

-- score_id = content_id("score", rollout_id, 1): sha256 of the canonical JSON, first 20 hex digits.
INSERT INTO scores_versioned
SELECT substr(sha256('["score",' || to_json(rollout_id)::VARCHAR || ',1]'), 1, 20), rollout_id, 1,
       run_id, iteration, role, domain, reward, components, group_key, advantage, created_at
FROM scores;

DROP VIEW role_rewards;
DROP TABLE scores;
ALTER TABLE scores_versioned RENAME TO scores;
CREATE INDEX scores_run_iter ON scores (run_id, iteration);

-- Per run, iteration and role, over the newest reward version scored in that iteration.
CREATE VIEW role_rewards AS
WITH current AS (
    SELECT * FROM scores
    QUALIFY reward_version = max(reward_version) OVER (PARTITION BY run_id, iteration)
)
SELECT s.run_id, s.iteration, s.role,
       count(*)              AS rollouts,
       avg(s.reward)         AS mean_reward,
       stddev_pop(s.reward)  AS std_reward,
       avg(s.advantage)      AS mean_advantage,
       stddev_pop(s.advantage) AS std_advantage,
       avg(CASE WHEN r.format_reward = 1.0 THEN 1.0 ELSE 0.0 END) AS format_rate,
       max(s.reward_version) AS reward_version
FROM current s JOIN rollouts r USING (rollout_id)
GROUP BY s.run_id, s.iteration, s.role;
