-- The curriculum the Solver sees (`iteration.generated_share`): per iteration, the Solver's training answers and how
-- many of them answer this run's generated questions, beside how many generated questions the config asked the
-- plan stage to draw (`generated_asked`: round half up of generated_share x n_plan, 0 without the setting) and how
-- many it drew (`generated_questions`: fewer than asked when too few were admitted; the pool filled the rest).
CREATE VIEW solver_curriculum AS
SELECT r.run_id, r.iteration,
       count(*)                                                           AS answers,
       count(*) FILTER (WHERE q.origin = 'generated')                     AS generated_answers,
       avg(CASE WHEN q.origin = 'generated' THEN 1.0 ELSE 0.0 END)        AS generated_share,
       count(DISTINCT r.question_id)                                      AS questions,
       count(DISTINCT r.question_id) FILTER (WHERE q.origin = 'generated') AS generated_questions,
       any_value(CAST(floor(coalesce(CAST(u.config -> 'iteration' ->> 'generated_share' AS DOUBLE)
                                     * CAST(u.config -> 'iteration' ->> 'n_plan' AS DOUBLE), 0) + 0.5) AS INTEGER))
                                                                          AS generated_asked
FROM rollouts r JOIN questions q ON q.question_id = r.question_id LEFT JOIN runs u ON u.run_id = r.run_id
WHERE r.role = 'solver' AND r.purpose = 'solve'
GROUP BY r.run_id, r.iteration
ORDER BY r.run_id, r.iteration;

-- Admission at the frontier (`iteration.admission`, `rewards.challenger_difficulty`). `batch_repetition`: the share of
-- the iteration's written questions within `rewards.repetition_similarity` (MinHash word-shingle Jaccard) of this
-- one, itself included, set by the admit stage: the repetition penalty of R-Zero's Challenger reward.
ALTER TABLE questions ADD COLUMN batch_repetition DOUBLE;

-- Every probed generated question: its probes, pass rate p (their mean s_gt, 1 - difficulty), the run's admission
-- rule and band, whether p is in the band, and what admission decided. A histogram of p:
-- SELECT round(pass_rate, 1), count(*) FROM admission_frontier WHERE admitted GROUP BY 1 ORDER BY 1.
CREATE VIEW admission_frontier AS
WITH probes AS (
    SELECT r.run_id, r.question_id, count(*) AS probes, avg(v.s_gt) AS pass_rate
    FROM rollouts r JOIN verdicts v USING (rollout_id)
    WHERE r.purpose = 'probe'
    GROUP BY r.run_id, r.question_id
)
SELECT q.run_id, q.iteration, q.question_id, q.domain, p.probes, p.pass_rate,
       coalesce(u.config -> 'iteration' ->> 'admission', 'quality')            AS admission,
       coalesce(CAST(u.config -> 'iteration' ->> 'band_low' AS DOUBLE), 0.3)   AS band_low,
       coalesce(CAST(u.config -> 'iteration' ->> 'band_high' AS DOUBLE), 0.7)  AS band_high,
       p.pass_rate BETWEEN coalesce(CAST(u.config -> 'iteration' ->> 'band_low' AS DOUBLE), 0.3)
                       AND coalesce(CAST(u.config -> 'iteration' ->> 'band_high' AS DOUBLE), 0.7) AS in_band,
       q.batch_repetition, q.s_q, q.admitted, q.rejection_reason
FROM questions q JOIN probes p ON p.run_id = q.run_id AND p.question_id = q.question_id
LEFT JOIN runs u ON u.run_id = q.run_id
WHERE q.origin = 'generated'
ORDER BY q.run_id, q.iteration, q.question_id;

-- Guarding the held-out sets. `test`: a new origin, problems held out from every choice (`seeds.heldout`, e.g. the
-- out-of-distribution set), never in the pool and never validated on. `content_key`: what a math question asks
-- whatever its words (the arithmetic analyser's key: a sum, an equation, a GCD's numbers), stored by the admit stage
-- for the questions it compares, so SQL can compare content, not only text.
ALTER TABLE questions ADD COLUMN content_key VARCHAR;

-- Every question of a run's pool (seeds, admitted questions) that copies a validation, benchmark or test question,
-- by normalised text or, where both keys are stored, by content: a held-out problem the run trains on.
CREATE VIEW heldout_leaks AS
WITH pool AS (
    SELECT r.run_id, q.question_id, q.origin, q.admitted_iteration, q.text, q.norm_hash, q.content_key
    FROM runs r JOIN questions q
      ON q.origin = 'seed' OR (q.origin = 'generated' AND q.admitted AND q.run_id = r.run_id)
),
held AS (
    SELECT question_id, origin, text, norm_hash, content_key FROM questions
    WHERE origin IN ('validation', 'benchmark', 'test')
),
matches AS (
    SELECT p.*, h.question_id AS heldout_id, h.origin AS heldout_origin, h.text AS heldout_text, 'text' AS matched_by
    FROM pool p JOIN held h ON h.norm_hash = p.norm_hash
    UNION ALL
    SELECT p.*, h.question_id, h.origin, h.text, 'content'
    FROM pool p JOIN held h ON h.content_key = p.content_key AND h.norm_hash <> p.norm_hash
)
SELECT run_id, question_id, origin, admitted_iteration AS iteration, text, heldout_id, heldout_origin, heldout_text,
       matched_by
FROM matches
ORDER BY run_id, heldout_origin, question_id, heldout_id;
