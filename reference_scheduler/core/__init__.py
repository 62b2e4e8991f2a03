"""Building blocks shared by every policy and driver: the job, the `Policy` protocol, the cost
model and its profiles, admission control, preemption, the global prefix cache, the reference
tokenizer and one-line config errors. Imports nothing else of the reference scheduler."""
