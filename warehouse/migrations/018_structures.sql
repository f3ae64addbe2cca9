-- New questions, not reworded ones. `structure`: which operations a math question composes, in which nesting, its
-- numbers abstracted (`gcd(mul(n,n),n)`), from the Challenger's program or, for a seed, its own arithmetic
-- (engines/text/arithmetic.py); NULL where neither says (a word problem, code). Stored by the admit stage for every
-- question it decides and for the seeds.
ALTER TABLE questions ADD COLUMN structure VARCHAR;

-- Per run and iteration, over the questions admitted in that iteration: how many have a structure, how many distinct
-- structures, how many have a structure no seed has (`novel_structures`, and their share of all admitted), beside
-- the word-trigram novelty against the seeds (`curriculum_novelty`).
CREATE VIEW curriculum_structures AS
WITH seed AS (SELECT DISTINCT structure FROM questions WHERE origin = 'seed' AND structure IS NOT NULL),
adm AS (
    SELECT q.run_id, q.admitted_iteration AS iteration, q.structure,
           q.structure IS NOT NULL AND s.structure IS NULL AS novel
    FROM questions q LEFT JOIN seed s ON s.structure = q.structure
    WHERE q.origin = 'generated' AND q.admitted
)
SELECT a.run_id, a.iteration,
       count(*)                                              AS admitted,
       count(a.structure)                                    AS with_structure,
       count(DISTINCT a.structure)                           AS structures,
       count(*) FILTER (WHERE a.novel)                       AS novel_structures,
       avg(CASE WHEN a.novel THEN 1.0 ELSE 0.0 END)          AS novel_share,
       any_value(n.novelty_vs_seeds)                         AS trigram_novelty_vs_seeds
FROM adm a LEFT JOIN curriculum_novelty n ON n.run_id = a.run_id AND n.iteration = a.iteration
GROUP BY a.run_id, a.iteration
ORDER BY a.run_id, a.iteration;
