-- A stable row order for every view users read: `SELECT * FROM <view>` lists runs, then iterations (then steps,
-- roles or questions) in order, the same on every read, instead of the order a hash join happened to produce.
-- Each definition is the one its latest migration gave, with an ORDER BY added and nothing else changed.

CREATE OR REPLACE VIEW pool AS
SELECT r.run_id, q.question_id, q.origin, q.domain, q.text, q.verifier, q.source,
       coalesce(q.admitted_iteration, 0) AS since_iteration
FROM runs r
JOIN questions q
  ON (q.origin = 'seed') OR (q.origin = 'generated' AND q.admitted AND q.run_id = r.run_id)
ORDER BY run_id, since_iteration, origin, question_id;

CREATE OR REPLACE VIEW question_trigrams AS
WITH words AS (
    SELECT question_id, origin, run_id, iteration, admitted,
           list_filter(string_split(regexp_replace(lower(text), '[^a-z0-9]+', ' ', 'g'), ' '), lambda x: x <> '') AS w
    FROM questions
)
SELECT question_id, origin, run_id, iteration, admitted,
       unnest(list_transform(range(1, len(w) - 1), lambda i: w[i] || ' ' || w[i + 1] || ' ' || w[i + 2])) AS gram
FROM words WHERE len(w) >= 3
ORDER BY run_id, iteration, question_id, gram;

CREATE OR REPLACE VIEW curriculum_novelty AS
WITH seed AS (SELECT DISTINCT gram FROM question_trigrams WHERE origin = 'seed'),
adm AS (
    SELECT t.run_id, q.admitted_iteration AS iteration, t.gram,
           min(q.admitted_iteration) OVER (PARTITION BY t.run_id, t.gram) AS first_iteration
    FROM question_trigrams t JOIN questions q USING (question_id)
    WHERE t.origin = 'generated' AND q.admitted
)
SELECT a.run_id, a.iteration,
       count(*)                                                   AS trigrams,
       count(DISTINCT a.gram)                                     AS distinct_trigrams,
       count(DISTINCT a.gram) / count(*)                          AS diversity,
       avg(CASE WHEN s.gram IS NULL THEN 1.0 ELSE 0.0 END)        AS novelty_vs_seeds,
       avg(CASE WHEN a.first_iteration = a.iteration THEN 1.0 ELSE 0.0 END) AS novelty_vs_earlier
FROM adm a LEFT JOIN seed s ON s.gram = a.gram
GROUP BY a.run_id, a.iteration
ORDER BY run_id, iteration;

CREATE OR REPLACE VIEW role_rewards AS
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
GROUP BY s.run_id, s.iteration, s.role
ORDER BY run_id, iteration, role;

CREATE OR REPLACE VIEW gate_stats AS
SELECT run_id, iteration,
       count(*)                                   AS plans,
       count(*) FILTER (WHERE passed)             AS passed,
       count(*) FILTER (WHERE NOT passed)         AS withheld,
       avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
       avg(s_p)                                   AS mean_s_p
FROM plans GROUP BY run_id, iteration
ORDER BY run_id, iteration;

CREATE OR REPLACE VIEW training_curve AS
SELECT run_id, iteration, step,
       row_number() OVER (PARTITION BY run_id ORDER BY iteration, step)                         AS global_step,
       loss, grad_norm, entropy, clip_fraction, learning_rate, tokens,
       sum(tokens) OVER (PARTITION BY run_id ORDER BY iteration, step)                          AS tokens_total,
       seconds,
       sum(seconds) OVER (PARTITION BY run_id, iteration ORDER BY step)                         AS iteration_seconds,
       created_at
FROM train_steps
ORDER BY run_id, iteration, step;

CREATE OR REPLACE VIEW probe_answers AS
WITH answers AS (
    SELECT r.run_id, r.question_id, v.tests ->> 'pred' AS pred, count(*) AS n, max(v.s_gt) AS best_s_gt
    FROM rollouts r JOIN verdicts v USING (rollout_id) JOIN questions q ON q.question_id = r.question_id
    WHERE r.purpose = 'probe' AND q.domain = 'math'
    GROUP BY ALL
)
SELECT run_id, question_id, sum(n) AS probes,
       first(pred ORDER BY n DESC, pred) FILTER (WHERE coalesce(pred, '') <> '')            AS probe_mode,
       max(n) FILTER (WHERE coalesce(pred, '') <> '') / sum(n)                             AS probe_mode_share,
       first(best_s_gt >= 1.0 ORDER BY n DESC, pred) FILTER (WHERE coalesce(pred, '') <> '') AS probe_mode_matches_label
FROM answers GROUP BY ALL
ORDER BY run_id, question_id;

CREATE OR REPLACE VIEW curriculum_audit AS
SELECT q.run_id, q.iteration, q.question_id, q.domain, q.source AS family, q.text,
       q.verifier ->> 'answer'         AS label,
       q.verifier ->> 'label'          AS label_check,
       q.verifier ->> 'program'        AS program,
       q.verifier ->> 'program_result' AS program_result,
       p.probes, p.probe_mode, p.probe_mode_share, p.probe_mode_matches_label,
       q.s_q, q.difficulty, q.admitted, q.rejection_reason, q.verifier_error,
       q.near_dup_similarity, q.near_dup_of,
       coalesce(d.origin = 'generated' AND d.run_id = q.run_id AND d.iteration = q.iteration
                AND q.near_dup_similarity >= 0.8, false) AS copy_of_batch,
       coalesce(q.admitted AND p.probe_mode_share > 0.5 AND NOT p.probe_mode_matches_label, false) AS suspect_label,
       q.parent_id, par.text AS parent_text, q.rollout_id
FROM questions q
LEFT JOIN probe_answers p ON p.run_id = q.run_id AND p.question_id = q.question_id
LEFT JOIN questions d ON d.question_id = q.near_dup_of
LEFT JOIN questions par ON par.question_id = q.parent_id
WHERE q.origin = 'generated'
ORDER BY run_id, iteration, question_id;

CREATE OR REPLACE VIEW curriculum_drift AS
WITH gen AS (
    SELECT run_id, iteration,
           count(*)                                              AS generated,
           count(*) FILTER (WHERE admitted)                      AS admitted,
           count(*) FILTER (WHERE NOT admitted)                  AS rejected,
           count(*) FILTER (WHERE rejection_reason = 'low_quality')      AS rejected_low_quality,
           count(*) FILTER (WHERE rejection_reason = 'invalid_verifier') AS rejected_invalid_verifier,
           count(*) FILTER (WHERE rejection_reason = 'duplicate')        AS rejected_duplicate,
           count(*) FILTER (WHERE rejection_reason = 'unparseable')      AS rejected_unparseable,
           count(*) FILTER (WHERE rejection_reason = 'contaminated')     AS rejected_contaminated,
           count(*) FILTER (WHERE rejection_reason = 'near_duplicate')   AS rejected_near_duplicate,
           count(*) FILTER (WHERE rejection_reason = label_check)  AS rejected_ungrounded,
           count(*) FILTER (WHERE label_check = 'grounded')     AS grounded,
           avg(copy_of_batch::INT)                               AS copy_share,
           avg(near_dup_similarity)                              AS mean_near_dup_similarity,
           max(near_dup_similarity)                              AS max_near_dup_similarity,
           avg(s_q)                                              AS mean_s_q,
           avg(difficulty)                                       AS mean_difficulty,
           avg(CASE WHEN domain = 'code' THEN 1.0 ELSE 0.0 END) FILTER (WHERE admitted) AS admitted_code_share,
           avg(length(text))                                     AS mean_question_chars,
           avg(length(text)) FILTER (WHERE admitted)             AS mean_admitted_chars
    FROM curriculum_audit
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
       coalesce(g.rejected_unparseable, 0) AS rejected_unparseable,
       coalesce(g.rejected_contaminated, 0) AS rejected_contaminated,
       coalesce(g.rejected_near_duplicate, 0) AS rejected_near_duplicate,
       g.mean_near_dup_similarity, g.max_near_dup_similarity,
       coalesce(g.grounded, 0) AS grounded,
       coalesce(g.rejected_ungrounded, 0) AS rejected_ungrounded,
       g.copy_share
FROM iterations i LEFT JOIN gen g USING (run_id, iteration)
ORDER BY run_id, iteration;

CREATE OR REPLACE VIEW validation_curve AS
SELECT run_id, iteration, val_accuracy, val_math, val_code, is_best, adapter_path, val_mean_s_gt, adapter_pruned_at,
       val_plan_shown, val_pipeline, val_plans_passed
FROM checkpoints WHERE val_accuracy IS NOT NULL
ORDER BY run_id, iteration;
