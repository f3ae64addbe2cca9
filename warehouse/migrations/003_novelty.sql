-- Novelty and diversity of the self-made curriculum, from word trigrams of question text.

CREATE VIEW question_trigrams AS
WITH words AS (
    SELECT question_id, origin, run_id, iteration, admitted,
           list_filter(string_split(regexp_replace(lower(text), '[^a-z0-9]+', ' ', 'g'), ' '), lambda x: x <> '') AS w
    FROM questions
)
SELECT question_id, origin, run_id, iteration, admitted,
       unnest(list_transform(range(1, len(w) - 1), lambda i: w[i] || ' ' || w[i + 1] || ' ' || w[i + 2])) AS gram
FROM words WHERE len(w) >= 3;

-- Per run and iteration, over the questions admitted in that iteration:
--   novelty_vs_seeds   share of trigrams that appear in no seed question
--   novelty_vs_earlier share of trigrams not seen in questions admitted in earlier iterations of the run
--   diversity          distinct trigrams / trigrams (1.0: no phrase repeats)
CREATE VIEW curriculum_novelty AS
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
GROUP BY a.run_id, a.iteration;
