"""Reference solution of notebook 09b's exercise: the batches of strategy tenant_batching, the strategy's own
file c_backends/batching/tenant_batching/tenant_batching.c (one source: set-up builds it as a strategy with
c_backends/include/tenant_batching.h, and the checker builds an answer with that header the same way)."""

from lab_backends.server.cbackend import STRATEGIES_DIR

answer = STRATEGIES_DIR / "tenant_batching" / "tenant_batching.c"
