"""Process-wide plumbing below the Kafka and HTTP shells: Prometheus metrics, the garbage
collector's tuning, local ports. Imports only the core.
"""
