"""The engine driven through time: `virtual` (a discrete-event loop, for sweeps; deterministic)
and `realtime` (the wall clock, for the HTTP server). Both step the same engine the same way;
only the waiting differs. Imports `core` and `scheduler`; `server` imports it."""
