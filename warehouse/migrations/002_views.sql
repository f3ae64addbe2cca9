-- Views users read with SQL. Every one is per run; seeds and validation rows have run_id NULL.

CREATE VIEW pool AS
SELECT r.run_id, q.question_id, q.origin, q.domain, q.text, q.verifier, q.source,
       coalesce(q.admitted_iteration, 0) AS since_iteration
FROM runs r
JOIN questions q
  ON (q.origin = 'seed') OR (q.origin = 'generated' AND q.admitted AND q.run_id = r.run_id);

CREATE VIEW curriculum_drift AS
WITH gen AS (
    SELECT run_id, iteration,
           count(*)                                              AS generated,
           count(*) FILTER (WHERE admitted)                      AS admitted,
           count(*) FILTER (WHERE NOT admitted)                  AS rejected,
           count(*) FILTER (WHERE rejection_reason = 'low_quality')      AS rejected_low_quality,
           count(*) FILTER (WHERE rejection_reason = 'invalid_verifier') AS rejected_invalid_verifier,
           count(*) FILTER (WHERE rejection_reason = 'duplicate')        AS rejected_duplicate,
           count(*) FILTER (WHERE rejection_reason = 'unparseable')      AS rejected_unparseable,
           avg(s_q)                                              AS mean_s_q,
           avg(difficulty)                                       AS mean_difficulty,
           avg(CASE WHEN domain = 'code' THEN 1.0 ELSE 0.0 END) FILTER (WHERE admitted) AS admitted_code_share,
           avg(length(text))                                     AS mean_question_chars,
           avg(length(text)) FILTER (WHERE admitted)             AS mean_admitted_chars
    FROM questions WHERE origin = 'generated'
    GROUP BY run_id, iteration
),
seeds AS (SELECT count(*) AS n FROM questions WHERE origin = 'seed')
SELECT i.run_id, i.iteration,
       (SELECT n FROM seeds) + (SELECT count(*) FROM questions q
                                WHERE q.run_id = i.run_id AND q.admitted AND q.admitted_iteration <= i.iteration)
                                                                AS pool_size,
       coalesce(g.generated, 0) AS generated, coalesce(g.admitted, 0) AS admitted,
       coalesce(g.rejected, 0) AS rejected,
       coalesce(g.rejected_low_quality, 0) AS rejected_low_quality,
       coalesce(g.rejected_invalid_verifier, 0) AS rejected_invalid_verifier,
       coalesce(g.rejected_duplicate, 0) AS rejected_duplicate,
       g.mean_s_q, g.mean_difficulty, g.admitted_code_share, g.mean_question_chars, g.mean_admitted_chars,
       coalesce(g.rejected_unparseable, 0) AS rejected_unparseable
FROM iterations i LEFT JOIN gen g USING (run_id, iteration);

CREATE VIEW role_rewards AS
SELECT s.run_id, s.iteration, s.role,
       count(*)              AS rollouts,
       avg(s.reward)         AS mean_reward,
       stddev_pop(s.reward)  AS std_reward,
       avg(s.advantage)      AS mean_advantage,
       stddev_pop(s.advantage) AS std_advantage,
       avg(CASE WHEN r.format_reward = 1.0 THEN 1.0 ELSE 0.0 END) AS format_rate
FROM scores s JOIN rollouts r USING (rollout_id)
GROUP BY s.run_id, s.iteration, s.role;

CREATE VIEW gate_stats AS
SELECT run_id, iteration,
       count(*)                                   AS plans,
       count(*) FILTER (WHERE passed)             AS passed,
       count(*) FILTER (WHERE NOT passed)         AS withheld,
       avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
       avg(s_p)                                   AS mean_s_p
FROM plans GROUP BY run_id, iteration;

CREATE VIEW validation_curve AS
SELECT run_id, iteration, val_accuracy, val_math, val_code, is_best, adapter_path
FROM checkpoints WHERE val_accuracy IS NOT NULL;
