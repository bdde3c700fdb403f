"""Observability: a stream's and a loader's figures where clusters look.

Exporters of ``stats()`` to Prometheus and OpenTelemetry, and the training-loop hooks
that log throughput and the stall share per epoch. This layer reads figures the layers
below it already keep; it adds no counter to the per-sample path.
"""
