-- A grounded math label whose question writes its arithmetic out (`What is 7 * 8?`, `y + 1 = 3`) must be that
-- arithmetic's value: the challenge stage's new reason `arithmetic_mismatch` counts in `rejected_ungrounded`.
-- Admission keeps a label's own reason exactly when the label is not grounded (`stages.admit.LABEL_FAILURES`),
-- so `rejected_ungrounded` counts the rows whose rejection reason is their label check, whatever reasons a later
-- version adds, instead of 009's list. The view is 009's otherwise unchanged.

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
FROM iterations i LEFT JOIN gen g USING (run_id, iteration);
