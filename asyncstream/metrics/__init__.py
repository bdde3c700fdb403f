"""Observability: a stream's and a loader's figures where clusters look.

Exporters of ``stats()`` to Prometheus and OpenTelemetry, and the training-loop hooks
that log throughput and the stall share per epoch. This layer reads figures the layers
below it already keep; it adds no counter to the per-sample path.

The public names (:func:`~asyncstream.export_prometheus`,
:func:`~asyncstream.export_opentelemetry`) are exported lazily by :mod:`asyncstream`;
importing this package imports neither prometheus_client nor OpenTelemetry.
"""
