"""OpenTelemetry traces across jobs and flows (docs/explanation/house.md,
"tracing/"; docs/howto/tracing.md): the caller's span for an add, the
worker's span per attempt, and the W3C ``traceparent`` a job row carries
between them. Off, at the cost of one check, when OpenTelemetry is not
installed or no tracer provider is configured."""
