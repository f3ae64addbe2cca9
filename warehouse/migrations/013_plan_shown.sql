-- Plans as hints (`iteration.hints`): whether a Solver rollout's prompt showed its question's plan. With `mixed`
-- hints a question whose plan passed the gate gets answers with and without it, so `plan_id` (the plan either way)
-- no longer says which. Rollouts written before this column: a training answer was shown its plan exactly when the
-- plan passed the gate; every other Solver answer (probes, validation, no Planner) was shown none.

ALTER TABLE rollouts ADD COLUMN plan_shown BOOLEAN;

UPDATE rollouts SET plan_shown = coalesce((SELECT p.passed FROM plans p WHERE p.plan_id = rollouts.plan_id), false)
WHERE role = 'solver';

-- The Solver's answers per iteration, shown a plan or not: how many, and how often right (s_gt = 1), so a run shows
-- whether plans help the answers they are shown to.
CREATE VIEW solver_hints AS
SELECT r.run_id, r.iteration, r.plan_shown,
       count(*)                                            AS answers,
       avg(CASE WHEN v.s_gt >= 1.0 THEN 1.0 ELSE 0.0 END)  AS pass_rate,
       avg(v.s_gt)                                         AS mean_s_gt
FROM rollouts r LEFT JOIN verdicts v USING (rollout_id)
WHERE r.role = 'solver' AND r.purpose = 'solve'
GROUP BY r.run_id, r.iteration, r.plan_shown
ORDER BY r.run_id, r.iteration, r.plan_shown;
