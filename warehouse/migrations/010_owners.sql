-- The process that set a run, iteration or stage `running` (its PID and host): `sage status` shows a row whose
-- owner is gone (killed outright, the machine restarted) as `dead` instead of `running`, without rewriting it.
ALTER TABLE runs ADD COLUMN owner_pid INTEGER;
ALTER TABLE runs ADD COLUMN owner_host VARCHAR;
ALTER TABLE iterations ADD COLUMN owner_pid INTEGER;
ALTER TABLE iterations ADD COLUMN owner_host VARCHAR;
ALTER TABLE stage_runs ADD COLUMN owner_pid INTEGER;
ALTER TABLE stage_runs ADD COLUMN owner_host VARCHAR;
