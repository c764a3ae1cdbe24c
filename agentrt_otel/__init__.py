"""Agent runs as OpenTelemetry traces: the event stream mapped to spans."""
