"""Training the shared LoRA adapter on stored rows: one TRR++ policy-gradient step through TRL's
`GRPOTrainer`, in this process or as `python -m sage.engines.train` in its own, and merging an adapter into
its base model for serving."""
