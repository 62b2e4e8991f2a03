"""The reference scheduler: request-level scheduling policies in front of a simulated GPU pool.

    core → policies → scheduler → drivers → server → __main__

`core` holds the building blocks that know no discipline (job, the policy protocol, the cost
model, admission, preemption, the prefix cache, config error lines, the reference tokenizer);
`policies` one file per discipline; `scheduler` the configured engine that steps replicas under
a policy; `drivers` that engine in virtual time (sweeps) and on the wall clock; `server` the
OpenAI-compatible HTTP server over the real-time driver. It never imports fairbench.
"""
