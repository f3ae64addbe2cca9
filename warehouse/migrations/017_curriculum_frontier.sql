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
       any_value(CAST(floor(coalesce(CAST(u.config -> 'iteration' ->> 'generated_share' AS DOUBLE), 0)
                            * CAST(u.config -> 'iteration' ->> 'n_plan' AS DOUBLE) + 0.5) AS INTEGER))
                                                                          AS generated_asked
FROM rollouts r JOIN questions q ON q.question_id = r.question_id LEFT JOIN runs u ON u.run_id = r.run_id
WHERE r.role = 'solver' AND r.purpose = 'solve'
GROUP BY r.run_id, r.iteration
ORDER BY r.run_id, r.iteration;
