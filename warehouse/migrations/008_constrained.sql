-- Whether a rollout was sampled under its role's output grammar (`roles.<role>.constrain`; grammar annealing,
-- `roles.<role>.unconstrained`, draws some training samples without it). NULL for rollouts written before
-- this column existed.

ALTER TABLE rollouts ADD COLUMN constrained BOOLEAN;
