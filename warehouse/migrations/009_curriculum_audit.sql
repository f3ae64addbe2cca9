-- Grounded math labels and the curriculum audit. A generated math question's `verifier` now holds `label` (how
-- its label was checked: `grounded`, or the reason it is not: no_program, program_failed, number_mismatch, operation_mismatch,
-- label_mismatch, no_answer; `answer_only` under `iteration.math_labels: answer`), the Challenger's `program` and
-- its `program_result`. Rejections keep the label's reason instead of `invalid_verifier`.

-- Per probed math question, the Solver probes' most common final answer (ties: the smaller text), its share of the
-- answers given and whether it matches the label: a label that a confident majority contradicts stands out. A probe
-- with no final answer gives none (it counts in `probes`, not in the share).
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
FROM answers GROUP BY ALL;

-- Every generated question with what decided it: label, program and result, the probes' modal answer, parent,
-- s_q, difficulty, admission and reason. `copy_of_batch`: its closest question (at MinHash similarity >= 0.8)
-- was written earlier in the same iteration. `suspect_label`: admitted while more than half the probes agree on
-- an answer the label rejects.
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
WHERE q.origin = 'generated';

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
           count(*) FILTER (WHERE rejection_reason IN ('no_program', 'program_failed', 'number_mismatch', 'operation_mismatch',
                                                       'label_mismatch', 'no_answer')) AS rejected_ungrounded,
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
FROM iterations i LEFT JOIN gen g USING (run_id, iteration);
